"""GitHub Actions matrix from ``nox -l --json``: one entry per row session, with the GPU runner it needs.

    python -m mtpmatrix.runner.ci_matrix [--tags a,b] [--tiers T,..] [--gpus N] [--max-gpus N] [--include-extra]
                                  [--from-json -|FILE] [--constraints DIR] [--github-output FILE]

prints ``{"include": [{"session": "gemma4_mtp(sglang-0.5.17)", "row": "sglang-0.5.17", "python": "3.11", "gpus": 1,
"runner": "gpu-1"}, ...]}``. The row list comes from nox (so CI runs exactly the sessions nox knows); GPU counts
come from the row files: ``# gpus: N`` (default 1), raised to what ``--tiers`` need when given (gsm8k serves the
TP2 pairs of settings.py; smoke with MTPMATRIX_SMOKE_TP=2 serves at TP 2) and to ``--gpus``, capped at
``--max-gpus`` (the largest runner there is) with a warning.

Selection: with ``--tags``, every row session carrying one of the tags (default or not, like ``nox -t``;
``--tags canary`` gives the canary sessions, each on its pinned row's runner); without, the default rows
(``gemma4_mtp``), plus ``gemma4_mtp_extra`` rows with ``--include-extra``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core import settings
from mtpmatrix.core.rows import Row, RowError, load_rows
from mtpmatrix.core.schema import TIERS, parse_tiers
from mtpmatrix.runner.canary import load_canaries
from mtpmatrix.runner.matrix import in_shard, preflight_tier_env

ROW_SESSIONS = ("gemma4_mtp", "gemma4_mtp_extra", "canary")  # canary: constraints/canary/, by tag only
DEFAULT_SESSION = "gemma4_mtp"
EXTRA_SESSION = "gemma4_mtp_extra"
RUNNER_PREFIX = "gpu-"


def shard(ids: list[str], i: int, n: int) -> list[str]:
    """The row ids of shard ``i`` of ``n`` (1-based), exactly as ``nox ... -- --shard I/N`` picks them."""
    return [r for r in ids if in_shard(r, ids, (i, n))]


def row_sessions(listing: list[dict]) -> list[dict]:
    """The parametrized row sessions of a ``nox -l --json`` listing (drops unit, report, ...)."""
    return [s for s in listing if s.get("name") in ROW_SESSIONS and (s.get("call_spec") or {}).get("row")]


def select(
    listing: list[dict], tags: list[str] | None = None, include_extra: bool = False, rows: dict[str, Row] | None = None
) -> list[dict]:
    """Row sessions carrying one of ``tags`` (nox's tags, and with ``rows`` the row files' own: the 'ci' row's
    session is not nox-tagged 'ci', so that `nox -t ci` runs the ci_row session instead of the matrix row)."""
    sessions = row_sessions(listing)
    if tags:
        wanted = set(tags)
        row_tags = {rid: set(r.tags) for rid, r in (rows or {}).items()}
        return [s for s in sessions if wanted & (set(s.get("tags") or ()) | row_tags.get(s["call_spec"]["row"], set()))]
    return [s for s in sessions if s["name"] == DEFAULT_SESSION or (include_extra and s["name"] == EXTRA_SESSION)]


def tier_gpus(tiers: list[str], env: dict | None = None) -> int:
    """GPUs the selected tiers need on one runner: gsm8k serves the default pairs at their TP size, smoke serves
    its tiny pairs at MTPMATRIX_SMOKE_TP. A bad MTPMATRIX_SMOKE_* value is a RowError (one line)."""
    need = 1
    if "gsm8k" in tiers:
        need = max([need] + [settings.resolve_pair(p, env).tp for p in settings.DEFAULT_PAIRS])
    smoke = preflight_tier_env(",".join(tiers), env)
    if smoke is not None:
        need = max(need, smoke.tp)
    return need


@dataclass(frozen=True)
class MatrixChoice:
    """What the command's options ask for: the rows carrying one of ``tags`` (none: the default rows, and the extra
    ones with ``include_extra``), the tiers they will run, and at least ``gpus``, at most ``max_gpus`` per runner."""

    tags: list[str] | None = None
    tiers: list[str] | None = None
    include_extra: bool = False
    gpus: int = 1
    max_gpus: int | None = None


def build_matrix(
    listing: list[dict],
    rows: dict[str, Row],
    choice: MatrixChoice | None = None,
    *,
    env: dict | None = None,
    warn=lambda msg: None,
) -> dict:
    """``{"include": [...]}`` for ``strategy.matrix``; raises RowError on a session whose row file is missing."""
    choice = choice or MatrixChoice()
    tiers = choice.tiers or []
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise RowError(f"--tiers: unknown tier(s) {', '.join(unknown)}; known: {', '.join(TIERS)}")
    floor = max(choice.gpus, tier_gpus(tiers, env))
    include = []
    for s in select(listing, choice.tags, choice.include_extra, rows):
        row_id = s["call_spec"]["row"]
        if row_id not in rows:
            raise RowError(f"nox lists {s['session']} but there is no row file {row_id}.txt")
        n = max(rows[row_id].gpus, floor)
        if choice.max_gpus is not None and n > choice.max_gpus:
            warn(f"{row_id} needs {n} GPUs; capped at --max-gpus {choice.max_gpus} (its TP{n} work cannot run there)")
            n = choice.max_gpus
        include.append(
            {
                "session": s["session"],
                "row": row_id,
                "python": s.get("python") or rows[row_id].python,
                "gpus": n,
                "runner": f"{RUNNER_PREFIX}{n}",
            }
        )
    return {"include": include}


def nox_listing(nox: list[str] | None = None, cwd: Path | None = None) -> list[dict]:
    """``nox -l --json`` for every row session (default and extra): selection happens in ``select``."""
    cmd = [*(nox or ["nox"]), "-l", "--json", "-s", *ROW_SESSIONS]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise RowError(f"{' '.join(cmd)} exited {proc.returncode}: {last}")
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtpmatrix.runner.ci_matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--tags", default="", help="comma-separated row tags (default: every default row)")
    p.add_argument(
        "--tiers",
        default="",
        help="tiers the rows will run; with gsm8k (and smoke at "
        "MTPMATRIX_SMOKE_TP), rows get runners for that TP size (default: the row files' '# gpus:' alone)",
    )
    p.add_argument("--gpus", type=int, default=1, help="at least this many GPUs for every row")
    p.add_argument("--max-gpus", type=int, default=None, help="largest runner there is; bigger needs are capped")
    p.add_argument("--include-extra", action="store_true", help="also rows marked 'default: false'")
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="read the listing from FILE ('-' = stdin) instead of "
        "running nox; give it `nox -l --json -s gemma4_mtp gemma4_mtp_extra` for extra rows",
    )
    p.add_argument("--constraints", type=Path, default=Path("constraints"), help="row files (default: ./constraints)")
    p.add_argument("--nox", default="nox", help="nox command line (default: nox), e.g. 'python -m nox'")
    p.add_argument("--github-output", metavar="FILE", help="also append matrix=... and count=... to FILE")
    a = p.parse_args(argv)
    try:
        if a.from_json:
            text = sys.stdin.read() if a.from_json == "-" else Path(a.from_json).read_text()
            listing = json.loads(text)
        else:
            listing = nox_listing(nox=shlex.split(a.nox), cwd=a.constraints.resolve().parent)
        rows = {r.id: r for r in load_rows(a.constraints)}
        # a canary runs on its pinned row's runner (gpus, python), selected by its own tags, never its row's
        rows.update(
            {
                cid: dataclasses.replace(c.base, id=cid, tags=("canary", *c.tags))
                for cid, c in load_canaries(a.constraints, list(rows.values())).items()
            }
        )
        choice = MatrixChoice(
            tags=parse_tiers(a.tags),
            tiers=parse_tiers(a.tiers),
            include_extra=a.include_extra,
            gpus=a.gpus,
            max_gpus=a.max_gpus,
        )
        result = build_matrix(listing, rows, choice, warn=lambda m: print(f"::warning::{m}", file=sys.stderr))
    except (RowError, json.JSONDecodeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, separators=(",", ":"))
    print(text)
    if a.github_output:
        with open(a.github_output, "a") as fh:
            fh.write(f"matrix={text}\ncount={len(result['include'])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
