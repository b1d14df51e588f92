"""``python -m mtpmatrix report``: build the summary, write summary.md, report.html and summary.json, print the
verdict, exit with what was proven (summary.EXIT_*)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mtpmatrix.core import schema
from mtpmatrix.core.atomic import atomic_write_json, atomic_write_text
from mtpmatrix.core.record_types import Summary
from mtpmatrix.core.schema import TIERS
from mtpmatrix.core.store import StoreError, find_run
from mtpmatrix.report import canaries, render
from mtpmatrix.report.summary import EXIT_BAD_INPUT, REPORT_DIR, ReportError, build_summary


def parse_require(text: str | None) -> list[str]:
    """``--require smoke,gsm8k`` -> ["smoke", "gsm8k"] (a tier named twice counts once); ReportError (one line) for
    an unknown tier."""
    tiers = list(dict.fromkeys(schema.parse_tiers(text)))
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise ReportError(f"--require: unknown tier(s) {', '.join(bad)}; known: {', '.join(TIERS)}")
    return tiers


def write_report(
    results: Path,
    run_id: str | None = None,
    *,
    baseline: str | None = None,
    out: Path | None = None,
    require: list[str] | tuple[str, ...] = (),
) -> tuple[Summary, dict[str, Path]]:
    """Build and write the report; returns (summary, {"md": ..., "html": ..., "json": ...})."""
    render.environment()  # no jinja2: say so before reading anything
    run_dir = find_run(results, run_id)
    base_dir = find_run(results, baseline) if baseline else None
    if base_dir is not None and base_dir.resolve() == run_dir.resolve():
        raise ReportError(f"--baseline {baseline} is the run being reported")
    out_dir = Path(out) if out else run_dir / REPORT_DIR
    summary = build_summary(run_dir, baseline_dir=base_dir, out_dir=out_dir, require=require)
    md = render.render_markdown(summary)
    if summary.get("canaries"):  # only a run that holds canary rows
        md += canaries.markdown(summary["canaries"])
    paths = {"md": out_dir / "summary.md", "html": out_dir / "report.html", "json": out_dir / "summary.json"}
    html = render.render_html(summary)
    _writing(paths["md"], lambda: atomic_write_text(paths["md"], md))
    _writing(paths["html"], lambda: atomic_write_text(paths["html"], html))
    _writing(paths["json"], lambda: atomic_write_json(paths["json"], summary))
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        try:
            with open(step, "a", encoding="utf-8") as fh:
                fh.write(md + "\n")
        except OSError as exc:
            raise ReportError(
                f"GITHUB_STEP_SUMMARY {step}: cannot append the summary ({exc.strerror or exc})"
            ) from None
    return summary, paths


def _writing(path: Path, write: Callable[[], None]) -> None:
    """``write()``; a read-only or full disk is one line naming ``path`` (exit 2, never sglang's 1)."""
    try:
        write()
    except OSError as exc:
        raise ReportError(f"{path}: cannot write the report ({exc.strerror or exc})") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="results/<RUN_ID>/ (default: the latest run)")
    p.add_argument("--baseline", metavar="RUN_ID", help="compare with this earlier run")
    p.add_argument("--out", type=Path, help="write here instead of results/<RUN_ID>/report/")
    p.add_argument(
        "--require",
        metavar="TIERS",
        default="",
        help="release gate: exit 3 unless these tiers are complete (their whole expected set ran and "
        "passed) in every row, e.g. smoke,gsm8k",
    )


def run(ns: argparse.Namespace) -> int:
    try:
        summary, paths = write_report(
            ns.results, ns.run_id, baseline=ns.baseline, out=ns.out, require=parse_require(ns.require)
        )
    except (ReportError, StoreError) as exc:  # one line, whatever a path in it holds
        print("error: " + str(exc).replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{render.MARKS[summary['verdict']]} {render.headline(summary)}")
    for r in summary["rows"]:
        cells = ", ".join(f"{t}={r['tiers'][t]['verdict']}" for t in summary["tiers"] if t in r["tiers"])
        if r["install"]["verdict"] == "failed":
            why = ((r["install"].get("failure") or {}).get("message") or "").split(":", 1)[0]
            cells = f"install failed: {why}" if why and why != "install failed" else "install failed"
        print(f"  {render.GLYPHS.get(r['verdict'], '?')} {r['id']}: {r['verdict']} ({cells})")
    b = summary["baseline"]
    if b:
        print(f"  vs {b['run_id']}: {len(b['new_failures'])} new failure(s), {len(b['fixed'])} fixed")
    print(f"report: {paths['html']}\n        {paths['md']}\n        {paths['json']}")
    return summary["exit_status"]
