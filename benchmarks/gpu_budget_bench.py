"""The two GPU budgets of issue #41, printed against their limits: the whole mutant catalogue's wall time on one GPU
(<= 600 s) and the default smoke suite's wall time against one cold sglang launch of the same run (<= 1.2).

    python benchmarks/gpu_budget_bench.py --run OUT [--release-note TEXT]     on a GPU box, in an env with sglang
    python benchmarks/gpu_budget_bench.py --mutants FILE [--smoke FILE]      from records already made

``--run OUT`` runs what a user runs with the defaults, one after the other on this box: ``python -m mtpmatrix
mutants --out OUT/mutants`` (every mutant of the catalogue, its own default parallelism) and the smoke tier through
``tools/gpu_box.sh OUT/smoke -m smoke`` (whose logs.tgz holds ``smoke-launch-budget.json``), then reads both records.
``--mutants`` reads a ``mutants.json`` and ``--smoke`` a ``smoke-launch-budget.json`` (or a docs/runs file that
holds several under ``runs``); either may be gzipped (``NAME.json.gz``, as docs/runs keeps them).

A record that ran a subset of the catalogue (``--mutants ID,ID``) says so: its wall time is not the catalogue's.
Exit 0 when every figure read is within its limit, 1 when one is over or the record is not the whole catalogue,
2 on bad input. The limits are the issue's; the numbers come from the records, never from this script.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mtpmatrix.core.atomic import read_json_or_gzip  # noqa: E402
from mtpmatrix.core.schema import SMOKE_LAUNCH_BUDGET_FILE  # noqa: E402
from mtpmatrix.faults.catalogue import CATALOGUE  # noqa: E402

CATALOGUE_LIMIT_S = 600.0  # issue #41: every mutant of a release killed in one run within 10 minutes
SMOKE_RATIO_LIMIT = 1.2  # issue #41: the default smoke suite within 1.2 x one cold launch


def _load(path: Path) -> dict:
    try:
        return read_json_or_gzip(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {path}: {exc}") from None


def catalogue_lines(record: dict) -> tuple[list[str], bool]:
    """Lines for a mutants.json, and whether it is within the limit for the whole catalogue."""
    version = (record.get("sglang") or {}).get("version") or "?"
    entries = record.get("mutants") or []
    ran = {m["id"] for m in entries}
    absent = [m.id for m in CATALOGUE if m.id not in ran]
    applicable = [m for m in entries if m.get("status") != "n.a."]
    killed = [m for m in applicable if m.get("status") == "killed"]
    seconds = record.get("seconds")
    budget = record.get("budget")
    lines = [
        f"mutants  sglang {version}: {len(killed)} of {len(applicable)} applicable killed "
        f"({len(entries) - len(applicable)} n.a.); baseline {record.get('baseline', {}).get('status')} in "
        f"{record.get('baseline', {}).get('seconds')} s; up to {record.get('max_servers')} servers at once on "
        f"{(record.get('host') or {}).get('cpus')} cores"
    ]
    for m in sorted(applicable, key=lambda m: -(m.get("seconds") or 0)):
        lines.append(f"  {m['id']:<36} {m.get('status'):<9} {m.get('seconds') or '-':>6} s")
    whole = not absent
    ok = whole and seconds is not None and seconds <= CATALOGUE_LIMIT_S and len(killed) == len(applicable)
    ratio = f"{seconds / CATALOGUE_LIMIT_S:.2f}" if seconds is not None else "-"
    lines.append(
        f"  wall {seconds} s / limit {CATALOGUE_LIMIT_S:.0f} s = {ratio}"
        + (f" (the run's --budget was {budget} s)" if budget else "")
        + ("" if whole else f"; NOT THE WHOLE CATALOGUE: {len(absent)} of {len(CATALOGUE)} not in this record")
        + ("; within" if ok else "; OVER or incomplete")
    )
    return lines, ok


def smoke_lines(data: dict) -> tuple[list[str], bool]:
    """Lines for smoke-launch-budget.json (one run, or a docs/runs file with several under ``runs``)."""
    runs = data["runs"] if "runs" in data else {"this run": data}
    lines, ok = [], True
    for name, b in runs.items():
        ratio = b.get("ratio")
        within = ratio is not None and ratio <= SMOKE_RATIO_LIMIT
        ok = ok and within
        lines.append(
            f"smoke    {name}: suite {b.get('suite_seconds')} s, {b.get('servers')} servers "
            f"({b.get('first_wave')} at once), one cold launch {b.get('cold_launch_seconds')} s: ratio {ratio} / "
            f"limit {SMOKE_RATIO_LIMIT} ({'within' if within else 'OVER'})"
        )
    return lines, ok


def run_both(out: Path) -> tuple[Path, Path]:
    """The defaults a user gets on this box: the whole catalogue, then the smoke tier alone."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "mtpmatrix", "mutants", "--out", str(out / "mutants")], cwd=REPO)
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    subprocess.run(["bash", str(REPO / "tools" / "gpu_box.sh"), str(out / "smoke"), "-m", "smoke"], cwd=REPO, env=env)
    # gpu_box.sh packs what the tier kept (its work folder) into logs.tgz
    budget = out / SMOKE_LAUNCH_BUDGET_FILE
    try:
        with tarfile.open(out / "smoke" / "logs.tgz") as tar:
            member = next(m for m in tar.getmembers() if Path(m.name).name == SMOKE_LAUNCH_BUDGET_FILE)
            budget.write_bytes(tar.extractfile(member).read())
    except (OSError, tarfile.TarError, StopIteration):
        raise SystemExit(f"error: the smoke run left no {SMOKE_LAUNCH_BUDGET_FILE} (see {out / 'smoke'})") from None
    return out / "mutants" / "mutants.json", budget


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, metavar="OUT", help="run the catalogue and the smoke tier here (GPU)")
    p.add_argument("--mutants", type=Path, metavar="FILE", help="a mutants.json")
    p.add_argument("--smoke", type=Path, metavar="FILE", help="a smoke-launch-budget.json")
    ns = p.parse_args(argv)
    if ns.run and (ns.mutants or ns.smoke):
        p.error("--run makes its own records: give --run, or --mutants/--smoke")
    if not (ns.run or ns.mutants or ns.smoke):
        p.error("give --run OUT, or --mutants FILE and/or --smoke FILE")
    mutants, smoke = run_both(ns.run) if ns.run else (ns.mutants, ns.smoke)
    ok, lines = True, []
    for path, read in ((mutants, catalogue_lines), (smoke, smoke_lines)):
        if path is None:
            continue
        got, within = read(_load(path))
        lines += got
        ok = ok and within
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
