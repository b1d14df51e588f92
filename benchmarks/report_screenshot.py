"""The report as a person sees it: report.html of a run, in headless Chromium, as a PNG.

    python benchmarks/report_screenshot.py [--results DIR --run RUN_ID] [--baseline RUN_ID] [--out DIR]

Without --results it files the real H200 smoke record (docs/runs/2026-12-01c-h200-sglang-0.5.17-smoke-default.json.gz,
as the unit tests' h200_run fixture files it: tests/unit/evidence_records.h200_record) into a scratch store with the
smoke launch budget the same H200 measured for that release's default suite
(docs/runs/2026-12-01b-h200-smoke-launch-budget.json.gz: the record's box shipped none) and reports that. Writes
report.html, summary.md and report.png into --out (default: a scratch folder), then checks the PNG is a page and not
a blank one: its size, and how many colours its pixels take (PIL where it is installed). Exit 0 when it is, 1 when
not, 2 when Chromium is missing (Debian: apt-get install chromium).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests" / "unit")]

from mtpmatrix.core import schema  # noqa: E402
from mtpmatrix.core.atomic import read_json_or_gzip  # noqa: E402
from mtpmatrix.report.cli import write_report  # noqa: E402

BUDGET_RECORD = REPO / "docs" / "runs" / "2026-12-01b-h200-smoke-launch-budget.json.gz"
BUDGET_RUN = "sglang-0.5.17 default suite (11 servers, one wave)"
WINDOW = "1280,2000"
MIN_COLOURS = 8  # a blank or error page takes one or two; the report's table, banner and figures take hundreds


def chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def h200_store(tmp: Path) -> tuple[Path, str]:
    """(results, run id) of the real H200 smoke record filed by the importer, with its release's launch budget."""
    from evidence_records import h200_record, write_box

    from mtpmatrix.runner import importer

    results = tmp / "results"
    importer.import_run(write_box(tmp / "box", h200_record()), "sglang-0.5.17", results=results, run_id="h200")
    budget = read_json_or_gzip(BUDGET_RECORD)["runs"][BUDGET_RUN]
    budget = {k: v for k, v in budget.items() if k != "env"}
    (results / "h200" / "sglang-0.5.17" / schema.SMOKE_LAUNCH_BUDGET_FILE).write_text(json.dumps(budget))
    return results, "h200"


def screenshot(browser: str, html: Path, png: Path, window: str = WINDOW) -> None:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={window}"]
    subprocess.run([*cmd, f"--screenshot={png}", html.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def colours(png: Path) -> int | None:
    """How many distinct colours the screenshot's pixels take; None without PIL."""
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(png) as img:
        return len(img.convert("RGB").getcolors(maxcolors=1 << 24) or [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path)
    p.add_argument("--run")
    p.add_argument("--baseline")
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("error: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="report-screenshot-"))
    results, run = (ns.results, ns.run) if ns.results else h200_store(tmp)
    out = ns.out or tmp / "report"
    _, paths = write_report(results, run, baseline=ns.baseline, out=out)
    png = out / "report.png"
    screenshot(browser, paths["html"], png)
    size, n = png.stat().st_size, colours(png)
    print(f"{png}: {size} bytes, {'?' if n is None else n} colours; figures: {paths['html'].read_text().count('<svg')}")
    ok = size > 20_000 and (n is None or n >= MIN_COLOURS)
    print("a page" if ok else "BLANK: the screenshot shows no page")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
