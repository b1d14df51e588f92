"""``python -m mtpmatrix``: report, import, plan, bisect, rows, releases, canary, mutants.

python -m mtpmatrix report [RUN_ID] [--results DIR] [--baseline RUN_ID] [--out DIR] [--require TIERS]
python -m mtpmatrix import OUT --row ROW [--run-id RUN_ID] [--results DIR]
python -m mtpmatrix plan RUN_ID --rows ROW,ROW [--results DIR] [--tiers T] [--with PKG==VER]
python -m mtpmatrix bisect PACKAGE GOOD BAD [--row ROW] [--tier TIER] [--known ID] [--run-id RUN_ID]
python -m mtpmatrix rows [--json]
python -m mtpmatrix releases [--json]
python -m mtpmatrix canary [CANARY ...] [--tiers T] [--budget S] [--with PKG==VER] [--resume]
python -m mtpmatrix mutants [--list | --check] [--mutants ID,ID] [--out DIR] [--timeout S] [--budget S]

Exit 1 belongs to sglang (a row broke); a fault of any command -- bad input, an unreadable or unwritable file, a
full disk, this tool's own bug -- is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback


def _rows(ns: argparse.Namespace) -> int:
    from mtpmatrix.core.paths import CONSTRAINTS_DIR
    from mtpmatrix.core.rows import RowError, load_rows

    try:
        rows = load_rows(CONSTRAINTS_DIR)
    except RowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    width = max(len(r.id) for r in rows)
    for r in rows:
        flags = ", ".join(r.tags) + ("" if r.default else (", " if r.tags else "") + "not default")
        print(
            f"{r.id:<{width}}  py{r.python}  {r.torch_backend:<5}  sglang {r.sglang:<8} transformers "
            f"{r.transformers:<8} torch {r.torch:<7}  [{flags}]  {r.description}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    from mtpmatrix.core import options
    from mtpmatrix.report import cli as report_cli
    from mtpmatrix.runner import bisect_cli, importer

    p = argparse.ArgumentParser(prog="python -m mtpmatrix", description="Gemma 4 MTP qualification matrix tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser(
        "report",
        parents=[options.parent()],
        help="Markdown/HTML/JSON summary of a run (exit 0 proven, 1 sglang or a dependency "
        "broke, 2 bad input, 3 not proven)",
    )
    report_cli.add_arguments(rp)
    ip = sub.add_parser(
        "import",
        parents=[options.parent(run_id="a new UTC timestamp")],
        help="file a tools/gpu_box.sh output folder under results/<run>/<row>/",
    )
    importer.add_arguments(ip)
    bp = sub.add_parser(
        "bisect",
        parents=[options.parent(run_id="bisect-<UTC timestamp>")],
        help="first bad release of PACKAGE between GOOD and BAD for a row and tier",
    )
    bisect_cli.add_arguments(bp)
    lp = sub.add_parser("rows", help="list the rows (constraints/*.txt)")
    lp.add_argument("--json", action="store_true", help="machine-readable")
    mp = sub.add_parser(
        "mutants",
        help="fault injection: does the smoke tier kill deliberate bugs in sglang's MTP "
        "path? (exit 0 only when the baseline passes and every mutant is killed)",
    )
    from mtpmatrix.faults import mutants

    mutants.add_arguments(mp)
    from mtpmatrix.runner import culprit, releases

    rl = sub.add_parser(
        "releases",
        parents=[options.parent()],
        help="releases of sglang/transformers/torch newer than every row's pin, and whether a canary has run them",
    )
    releases.add_arguments(rl)
    from mtpmatrix.runner import plan

    pp = sub.add_parser(
        "plan",
        parents=[options.parent(overrides=True)],
        help="fix a run's plan before its rows run as separate jobs (a CI pipeline): "
        "results/<RUN_ID>/manifest-pipeline.json",
    )
    plan.add_arguments(pp)
    cp = sub.add_parser(
        "canary",
        help="run canary rows (constraints/canary/) and, when one breaks, find the culprit; "
        "other options as for nox -s gemma4_mtp --",
    )
    culprit.add_arguments(cp)
    ns, rest = p.parse_known_args(argv)
    if ns.cmd != "canary" and rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return culprit.run(ns, rest) if ns.cmd == "canary" else _command(ns)(ns)
    except Exception as exc:  # exit 1 is sglang's verdict: nothing else may end with it
        if not isinstance(exc, (OSError, UnicodeError, RecursionError)):
            traceback.print_exc()  # this tool's bug: where it is, then the one line
        print(f"error: {fault_line(exc)}", file=sys.stderr)
        return 2


def fault_line(exc: BaseException) -> str:
    """One line for a fault no command turned into its own message: an I/O fault (a read-only or full disk, a
    missing folder) or a parse fault says what and where; anything else is this tool's bug, said as one."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (OSError, UnicodeError, RecursionError)):
        return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"
    return f"internal error ({type(exc).__name__}: {text}): a fault of mtpmatrix, no verdict on sglang"


def _command(ns: argparse.Namespace):
    from mtpmatrix.faults import mutants
    from mtpmatrix.report import cli as report_cli
    from mtpmatrix.runner import bisect_cli, importer, plan, releases

    return {
        "releases": releases.run,
        "mutants": mutants.run,
        "report": report_cli.run,
        "bisect": bisect_cli.run,
        "import": importer.run,
        "plan": plan.run,
    }.get(ns.cmd, _rows)


if __name__ == "__main__":
    sys.exit(main())
