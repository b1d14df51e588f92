"""One warm CPU row against its floor, measured in the same run: prints both and the ratio (issue #21: <= 1.3).

    python benchmarks/row_floor_bench.py [--row sglang-0.5.17[,ROW...]] [--repeat 1] [--one-process] [--tiers T]
                                         [--taskset CPUS] [--records-out FILE] [--records-from FILE]

Row: ``nox -s "gemma4_mtp(ROW)"`` as a user runs it (nox, the row's uv venv and install, freeze and check, the
suite), wall clock from start to exit, results in a temp folder. Floor: what no suite design can remove, the row's
install (its recorded install command, run again into a new venv with nothing beside it, right after the row) plus
one ``import sglang.srt.models.gemma4_mtp`` in the row's venv, timed right before and right after the row and
averaged (its CPU: the import after the row), so a machine whose speed drifts inflates row and floor alike. That
import is a fresh venv's first: compiled from source (an empty PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE=1), as
the row's own first import is. Warm: the
uv cache, the row's tiny pairs (.cache/tiny/ROW) and its lists of imports to compile ahead, with where uv's cache
holds them (.cache/bytecode/), exist; when they do not, one unmeasured row makes them first.

``--one-process`` runs the suite as one pytest process without compiling ahead (MTPMATRIX_SIDE_BY_SIDE=0,
MTPMATRIX_PRECOMPILE=0: the layout before this work) as well, and says whether the two left the same records:
per tier the verdict, and per check its id, outcome, failure kind and metrics (names; values but timings).
CPU seconds (user + system of every child) are printed next to wall seconds, and per check (the CPU time its pytest
process spent in its setup and call, ``cpu_seconds`` of its record), summed by test function; the reference tier's
checks are the row's model work (transformers on the tiny pairs), printed as a share of the row's seconds.

``--taskset CPUS`` runs the row and its floor on those CPUs only (``taskset -c``; ``--taskset 0``: one core), a
machine with less arithmetic to give: the ratio must hold there too (issue #31: another 2-core box ran the reference
tier's model work three times slower). ``--records-out FILE`` writes the records of the first run per row;
``--records-from FILE`` compares each run with such a file, written by another revision of the suite: a change
that is to leave the records alone (a faster suite) shows it did.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORT = "import sglang.srt.models.gemma4_mtp"


def _nox() -> list[str]:
    if importlib.util.find_spec("nox"):
        return [sys.executable, "-m", "nox"]
    if shutil.which("nox"):
        return [shutil.which("nox")]
    raise SystemExit("nox is not installed here (pip install -e '.[dev]')")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


PINNED: list[str] = []  # ["taskset", "-c", CPUS] with --taskset: every measured command runs on those CPUs


def _timed(cmd: list[str], env: dict, quiet: bool = True) -> tuple[float, float, int]:
    """(wall, CPU of the command and its children, exit status)."""
    cmd = [*PINNED, *cmd]
    cpu0, t0 = _children_cpu(), time.monotonic()
    done = subprocess.run(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
    )
    return time.monotonic() - t0, _children_cpu() - cpu0, done.returncode


def _bytecode_list(row_id: str) -> Path:
    """The row's lists of files to compile ahead (mtpmatrix.runner.bytecode), kept by its first suite."""
    sys.path.insert(0, str(REPO / "src"))
    from mtpmatrix.core.rows import load_rows
    from mtpmatrix.runner import bytecode

    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    if row_id not in rows:
        raise SystemExit(f"unknown row {row_id!r}; known: {', '.join(rows)}")
    return bytecode.lists_folder(rows[row_id])


def venv_of(row: str) -> Path:
    """nox's folder for the row's session: ``gemma4_mtp(sglang-0.5.17)`` -> .nox/gemma4_mtp-sglang-0-5-17."""
    return REPO / ".nox" / re.sub(r"[^\w]+", "-", f"gemma4_mtp({row})").strip("-")


def run_row(row: str, results: Path, run_id: str, one_process: bool, tiers: str | None = None) -> dict:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "MTPMATRIX_PRECOMPILE": "0" if one_process else "1"}
    env.pop("MTPMATRIX_TIERS", None)
    # unset, the row decides as a user's does: side by side where it has two cores, one process on one
    # (--taskset 0); forcing it on made one core run both processes at once (2.98 x on 2026-12-02)
    env.pop("MTPMATRIX_SIDE_BY_SIDE", None)
    if one_process:
        env["MTPMATRIX_SIDE_BY_SIDE"] = "0"
    # the floor's import is timed on both sides of the row and averaged: this machine's speed drifts by a third
    # within minutes (the same import took 22 s and 32 s ten minutes apart), and one side alone carries that drift
    # into the ratio
    first_import, _first_cpu = floor_import(row, env) if venv_of(row).is_dir() else (None, None)
    wall, cpu, rc = _timed(
        [
            *_nox(),
            "-s",
            f"gemma4_mtp({row})",
            "--",
            "--results",
            str(results),
            "--run-id",
            run_id,
            *(["--tiers", tiers] if tiers else []),
        ],
        env,
    )
    folder = results / run_id / row
    record = json.loads((folder / "row.json").read_text())
    tiers = json.loads((folder / "tiers.json").read_text()) if (folder / "tiers.json").exists() else {"tiers": {}}
    # the floor's install: the row's own install command, into a new venv, with nothing beside it (the row's
    # install shares the machine with the imports compiled while it runs, mtpmatrix.runner.bytecode_from_cache: its
    # seconds would carry them into the floor)
    install = floor_install(record["install"]["command"], env)
    floor_wall, floor_cpu = floor_import(row, env)
    if first_import is not None:
        floor_wall = (first_import + floor_wall) / 2
    return {
        "wall": wall,
        "cpu": cpu,
        "nox_exit": rc,
        "verdict": record.get("verdict"),
        "install": install,
        "row_install": record["install"]["seconds"],
        "suite": record.get("suite", {}).get("seconds"),
        "tiers": {t: e.get("seconds") for t, e in tiers["tiers"].items()},
        "import": floor_wall,
        "import_cpu": floor_cpu,
        "floor": install + floor_wall,
        "records": records_of(tiers),
        "checks": check_seconds(tiers),
    }


def floor_import(row: str, env: dict) -> tuple[float, float]:
    """(wall, CPU) of a fresh venv's first MTP import in the row's venv: compiled from source (an empty bytecode
    folder, none kept)."""
    with tempfile.TemporaryDirectory(prefix="floor-pyc-") as empty:
        wall, cpu, rc = _timed(
            [str(venv_of(row) / "bin" / "python"), "-c", IMPORT],
            {**env, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    if rc != 0:
        raise SystemExit(f"{IMPORT} fails in {venv_of(row)} (exit {rc}): no floor to compare with")
    return wall, cpu


def floor_install(command: list[str], env: dict) -> float:
    """Seconds of the row's install command (row.json ``install.command``: ``pip install --python VENV_PYTHON
    ...``) run by the same uv into a new venv of the same Python, timed as run_row times it."""
    uv = shutil.which("uv", path=env.get("PATH"))
    if uv is None or "--python" not in command:
        raise SystemExit(f"cannot repeat the row's install ({command[:3]}...): no uv, or no --python in it")
    at = command.index("--python") + 1
    # beside the row's venv: the same file system, so uv links from its cache as it does for the row
    with tempfile.TemporaryDirectory(prefix="floor-venv-", dir=venv_of("x").parent) as scratch:
        venv = Path(scratch) / "venv"
        made = subprocess.run(
            [uv, "venv", "-q", "--python", command[at], str(venv)], env=env, cwd=REPO, capture_output=True, text=True
        )
        if made.returncode != 0:
            raise SystemExit(f"uv venv for the floor's install failed: {made.stderr.strip()}")
        wall, _cpu, rc = _timed(
            [uv, *command[:at], str(venv / "bin" / "python"), *command[at + 1 :]], {**env, "VIRTUAL_ENV": str(venv)}
        )
    if rc != 0:
        raise SystemExit(f"the floor's install failed (exit {rc}): {' '.join(command)}")
    return wall


def _timing(name: str) -> bool:
    """A metric that times something (``seconds``, ``chain_seconds``): its value differs from run to run."""
    return name == "seconds" or name.endswith("_seconds")


def records_of(tiers: dict) -> dict:
    """What must not change with the suite's layout: per tier the verdict, per check id, outcome, kind, and its
    metrics (names; values too, except timings)."""
    return {
        t: {
            "verdict": e.get("verdict"),
            "failure_kinds": e.get("failure_kinds"),
            # lists, not tuples: records read back from a --records-out file compare equal
            "checks": [
                [
                    c["id"],
                    c["outcome"],
                    (c.get("failure") or {}).get("kind"),
                    json.dumps(
                        {k: (None if _timing(k) else v) for k, v in c.get("metrics", {}).items()}, sort_keys=True
                    ),
                ]
                for c in e.get("checks", [])
            ],
        }
        for t, e in tiers.get("tiers", {}).items()
    }


def check_seconds(tiers: dict) -> list[tuple[str, str, float, float | None]]:
    """(tier, check id, wall seconds, CPU seconds or None for a record without them) of every check."""
    return [
        (t, c["id"], c.get("seconds") or 0.0, c.get("cpu_seconds"))
        for t, e in tiers.get("tiers", {}).items()
        for c in e.get("checks", [])
    ]


MODEL_WORK_TIER = "reference"  # transformers' generate on the tiny pairs: the row's arithmetic


def print_checks(row: str, m: dict) -> None:
    """Per test function (parameters summed): wall and CPU seconds, and the model work's share of the row."""
    by_function: dict[tuple[str, str], list[float]] = {}
    for tier, cid, wall, cpu in m["checks"]:
        key = (tier, cid.rsplit("::", 1)[-1].split("[", 1)[0])
        acc = by_function.setdefault(key, [0.0, 0.0, 0])
        acc[0] += wall
        acc[1] += cpu or 0.0
        acc[2] += 1
    print(f"{row}: per check function (checks, wall s, CPU s)")
    for (tier, fn), (wall, cpu, n) in sorted(by_function.items(), key=lambda kv: -kv[1][1]):
        print(f"  {tier:<10} {fn:<58} {n:3d} {wall:7.2f} {cpu:7.2f}")
    wall = sum(w for t, _i, w, _c in m["checks"] if t == MODEL_WORK_TIER)
    cpu = sum(c or 0.0 for t, _i, _w, c in m["checks"] if t == MODEL_WORK_TIER)
    print(
        f"{row}: model work ({MODEL_WORK_TIER} tier) {wall:.1f} check-seconds, CPU {cpu:.1f} s: "
        f"{cpu / m['cpu']:.0%} of the row's CPU {m['cpu']:.1f} s; the row's wall {m['wall']:.1f} s",
        flush=True,
    )


def _line(label: str, m: dict, limit: float) -> str:
    ratio = m["wall"] / m["floor"]
    tiers = ", ".join(f"{t} {s:.1f}" for t, s in m["tiers"].items() if s)
    return (
        f"{label:<13} row {m['wall']:6.1f} s (cpu {m['cpu']:6.1f})  install {m['row_install']:5.1f}  suite "
        f"{m['suite'] or 0:5.1f}  [{tiers}]  | floor {m['floor']:5.1f} = install {m['install']:4.1f} + import "
        f"{m['import']:5.1f} "
        f"(cpu {m['import_cpu']:4.1f})  | ratio {ratio:4.2f} {'<=' if ratio <= limit else '>'} {limit}  "
        f"({m['verdict']})"
    )


def bench_row(row: str, args, results: Path) -> bool:
    """Measure one row (and its floor), ``args.repeat`` times per layout; print each run and the medians. Returns
    whether the records were identical across layouts and repeats (True without --one-process)."""
    layouts = [("now", False)] + ([("one-process", True)] if args.one_process else [])
    if (
        not (REPO / ".cache" / "tiny" / row).is_dir()
        or not any(_bytecode_list(row).glob("*.txt"))
        or not (_bytecode_list(row) / "sources.json").is_file()
    ):
        print(
            f"warming up: {row}'s tiny pairs, lists of imports or sources.json are not there yet (one unmeasured row)",
            flush=True,
        )
        run_row(row, results, f"warmup-{row}", one_process=False)
    runs: dict[str, list[dict]] = {name: [] for name, _ in layouts}
    print(f"{row}: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    for i in range(args.repeat):
        for name, one in layouts:  # interleaved, so a change in the machine's load hits both layouts
            m = run_row(row, results, f"{name}-{i}", one, args.tiers)
            runs[name].append(m)
            print(_line(f"{name} #{i + 1}", m, args.limit), flush=True)
            print_checks(f"{name} #{i + 1}", m)
            if args.records_out and i == 0 and name == "now":
                saved = json.loads(args.records_out.read_text()) if args.records_out.is_file() else {}
                args.records_out.write_text(json.dumps({**saved, row: m["records"]}, indent=1, sort_keys=True))
    for name, ms in runs.items():
        med = {
            k: statistics.median(m[k] for m in ms)
            for k in ("wall", "cpu", "install", "row_install", "import", "import_cpu", "floor")
        }
        med["suite"] = statistics.median(m["suite"] or 0 for m in ms)
        med["tiers"] = {t: statistics.median(m["tiers"].get(t) or 0 for m in ms) for t in ms[0]["tiers"]}
        med["verdict"] = "/".join(sorted({m["verdict"] for m in ms}))
        print(_line(f"{name} median", med, args.limit))
    print(f"load average after {row}: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n", flush=True)
    same = True
    if args.records_from:
        other = json.loads(args.records_from.read_text()).get(row)
        same = other is not None and all(m["records"] == other for ms in runs.values() for m in ms)
        print(
            f"{row}: records identical to {args.records_from}'s (verdicts; check ids, outcomes, kinds, metrics but "
            f"timings): {'yes' if same else 'NO'}"
        )
        if other is not None and not same:
            print(_records_diff(other, runs["now"][0]["records"]))
    if not args.one_process:
        return same
    identical = all(m["records"] == runs["now"][0]["records"] for ms in runs.values() for m in ms)
    print(
        f"{row}: records (verdicts; check ids, outcomes, kinds, metrics but timings) identical across layouts and "
        f"repeats: {'yes' if identical else 'NO'}"
    )
    return same and identical


def _records_diff(before: dict, after: dict) -> str:
    """The checks whose records differ (first 10), as 'tier id: before -> after'."""
    lines = []
    for tier in sorted(set(before) | set(after)):
        b, a = before.get(tier, {}), after.get(tier, {})
        if b.get("verdict") != a.get("verdict"):
            lines.append(f"  {tier} verdict: {b.get('verdict')} -> {a.get('verdict')}")
        old = {c[0]: c for c in b.get("checks", [])}
        new = {c[0]: c for c in a.get("checks", [])}
        lines += [
            f"  {tier} {cid}: {old.get(cid)} -> {new.get(cid)}"
            for cid in sorted(set(old) | set(new))
            if old.get(cid) != new.get(cid)
        ]
    return "\n".join(lines[:10])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--row",
        default="sglang-0.5.17",
        help="a row, or several comma-separated (each measured in turn): sglang-0.5.17,sglang-0.5.13,sglang-0.5.23",
    )
    ap.add_argument("--repeat", type=int, default=1, help="rows (and floors) measured per layout; medians printed")
    ap.add_argument(
        "--one-process", action="store_true", help="also run the suite as one pytest process and compare the records"
    )
    ap.add_argument("--tiers", help="run only these tiers, as a bisect probe of one tier does (default: the row's)")
    ap.add_argument("--limit", type=float, default=1.3)
    ap.add_argument("--keep", action="store_true", help="keep the results folder (printed)")
    ap.add_argument(
        "--taskset",
        metavar="CPUS",
        help="run the row and its floor on these CPUs only (taskset -c CPUS): less arithmetic, as on a slower machine",
    )
    ap.add_argument("--records-out", type=Path, help="write each row's records (first run) to this JSON file")
    ap.add_argument(
        "--records-from",
        type=Path,
        help="compare every run's records with this file's (--records-out of another revision)",
    )
    args = ap.parse_args(argv)
    if args.taskset:
        if shutil.which("taskset") is None:
            ap.error("--taskset needs taskset (util-linux)")
        PINNED[:] = ["taskset", "-c", args.taskset]
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    rows = [r.strip() for r in args.row.split(",") if r.strip()]
    for row in rows:
        _bytecode_list(row)  # an unknown row: one line, before anything runs
    results = Path(tempfile.mkdtemp(prefix="row-floor-bench-"))
    same = all([bench_row(row, args, results) for row in rows])
    print(f"results: {results}" if args.keep else "")
    if not args.keep:
        shutil.rmtree(results, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
