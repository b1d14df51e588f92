"""A row session's options (after nox's ``--``) and the pre-flight checks that run before anything installs: bad
input is one RowError line here, never a record."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core import options, paths, smoke_servers
from mtpmatrix.core.paths import results_root
from mtpmatrix.core.rows import RowError, parse_override
from mtpmatrix.core.schema import TIERS, parse_tiers
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import candidate, index
from mtpmatrix.serving import served


@dataclass
class Options:
    overrides: list[str] = field(default_factory=list)
    run_id: str | None = None
    resume: bool = False
    results: Path = field(default_factory=results_root)
    tiers: str = ",".join(TIERS)
    shard: tuple[int, int] | None = None
    pytest_args: list[str] = field(default_factory=list)
    offline_check: bool = False  # skip the index pre-flight (air-gapped boxes with a local mirror)
    server_urls: list[str] = field(default_factory=list)  # gsm8k tier against running servers (served.py)
    record_extra: dict = field(default_factory=dict)  # merged into row.json (a canary's resolution, canary.py)
    candidate: candidate.Candidate | None = None  # --patch / --sglang: what replaces the pinned sglang


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard wants I/N, e.g. 1/4, got {text!r}") from None
    if not (n >= 1 and 1 <= i <= n):
        raise argparse.ArgumentTypeError(f"--shard {text}: need 1 <= I <= N")
    return i, n


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one RowError line (the session reports it) instead of usage + SystemExit(2)
        raise RowError(f"{self.prog} {message}")


PYTEST_ARGS_HINT = "pytest options go after a second --: nox -s gemma4_mtp -- -- -k topk3"


def split_pytest_args(posargs: list[str]) -> tuple[list[str], list[str]]:
    """(the session's own arguments, pytest's): pytest gets exactly what follows the first ``--`` of the session
    arguments (nox's own ``--`` is already gone), as given."""
    if "--" not in posargs:
        return list(posargs), []
    i = posargs.index("--")
    return list(posargs[:i]), list(posargs[i + 1 :])


def parse_options(posargs: list[str]) -> Options:
    """Session arguments (after nox's ``--``); pytest's go after a second ``--`` (``split_pytest_args``). Anything
    else this session does not know is a RowError (one line): passed on, pytest would stop with a usage error and
    the row be filed with an ``error`` tier, bad input recorded as evidence."""
    ours, pytest_args = split_pytest_args(posargs)
    p = _Parser(
        prog="nox -s gemma4_mtp --",
        add_help=True,
        parents=[options.parent(run_id="a UTC timestamp; env MTPMATRIX_RUN_ID", overrides=True)],
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="RUN_ID",
        help="continue a run, skipping rows that already have a verdict (default: the latest run)",
    )
    p.add_argument("--tiers", default=os.environ.get("MTPMATRIX_TIERS", ",".join(TIERS)))
    p.add_argument("--shard", type=_shard, help="run only shard I of N (rows in id order, round robin)")
    p.add_argument(
        "--no-index-check",
        dest="offline_check",
        action="store_true",
        help="do not ask the index whether --with releases exist before installing",
    )
    p.add_argument(
        "--server-url",
        dest="server_urls",
        action="append",
        default=[],
        metavar="URL",
        help="run the gsm8k tier against this running sglang server (repeatable; checked before install)",
    )
    p.add_argument("--patch", metavar="FILE", help="a candidate: this unified diff applied to each row's pinned sglang")
    p.add_argument("--sglang", metavar="PATH", help="a candidate: this sglang wheel or checkout instead of the pin")
    p.add_argument("--draft-phase", metavar="N", help="the draft phase the candidate drafts at (e.g. +1)")
    ns, unknown = p.parse_known_args(ours)
    if unknown:
        what = "option" if unknown[0].startswith("-") else "argument"
        raise RowError(f"{p.prog} : unknown {what} {unknown[0]} ({PYTEST_ARGS_HINT})")
    for spec in ns.overrides:
        parse_override(spec)  # raises RowError with one line
    tiers = parse_tiers(ns.tiers)  # as the pytest plugin reads them
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise RowError(f"--tiers: unknown tier(s) {', '.join(bad)}; known: {', '.join(TIERS)}")
    if not tiers:
        raise RowError(f"--tiers: no tier given; known: {', '.join(TIERS)}")
    run_id = ns.run_id or os.environ.get("MTPMATRIX_RUN_ID")
    resume = ns.resume is not None
    if resume and ns.resume != "latest":
        run_id = ns.resume
    elif resume:
        latest = RunStore.latest(ns.results)
        if latest is None:
            raise RowError(f"--resume: no earlier run under {ns.results}/")
        run_id = run_id or latest.run_id
    if run_id is not None:
        try:
            paths.single_name(run_id, "--run-id")
        except paths.NameError_ as exc:  # a path would write the run outside the results root
            raise RowError(str(exc)) from None
    if ns.server_urls and "gsm8k" not in tiers:
        raise RowError("--server-url serves the gsm8k tier: add --tiers gsm8k (or a list that has it)")
    return Options(
        overrides=ns.overrides,
        run_id=run_id,
        resume=resume,
        results=ns.results,
        tiers=",".join(tiers),
        shard=ns.shard,
        pytest_args=pytest_args,
        offline_check=ns.offline_check,
        server_urls=ns.server_urls,
        candidate=candidate.from_options(ns.patch, ns.sglang, ns.draft_phase, ns.overrides),
    )


def in_shard(row_id: str, all_ids: list[str], shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    i, n = shard
    return sorted(all_ids).index(row_id) % n == i - 1


def preflight_overrides(overrides: list[str], *, skip_index: bool = False) -> None:
    """One clear error before anything is installed: malformed spec, unknown package/release, dead index."""
    for spec in overrides:
        req = parse_override(spec)
        if not skip_index:
            try:
                index.check_spec(req)
            except index.IndexError_ as exc:
                raise RowError(f"--with {spec}: {exc}") from None


def preflight_row_index(row, *, skip_index: bool = False) -> None:
    """A CUDA-variant row takes torch from the PyTorch index (uv's --torch-backend): one clear error before anything is
    installed when that index does not answer (else the install fails there, a few seconds and a venv later)."""
    if skip_index or row.torch_backend == "pypi":
        return
    url = f"{index.PYTORCH_INDEX}/{row.torch_backend}/"
    try:
        index.check_reachable(url)
    except index.IndexError_ as exc:
        raise RowError(f"row {row.id} installs torch with --torch-backend {row.torch_backend}: {exc}") from None


def preflight_tier_env(tiers: str, env: dict | None = None):
    """The smoke tier's environment knobs (MTPMATRIX_SMOKE_*), checked before anything is installed whatever the
    tiers (a bad value is bad input even where it would go unread): its ``SmokeOptions`` when smoke is selected, else
    None; a bad value is a RowError (one line)."""
    try:
        options = smoke_servers.smoke_options(env)
    except ValueError as exc:
        raise RowError(str(exc)) from None
    return options if "smoke" in parse_tiers(tiers) else None


def preflight_servers(urls: list[str]) -> list:
    """Every --server-url answers /server_info like an sglang server (served.fetch_all), before anything is
    installed; a RowError (one line) otherwise. Returns what each serves."""
    if not urls:
        return []
    try:
        return served.fetch_all(urls)
    except served.ServedError as exc:
        raise RowError(str(exc)) from None
