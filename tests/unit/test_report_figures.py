"""The report's figures (mtpmatrix.report.figures) drawn from real records: the H200 smoke record as the importer files
it (h200_run) and the hand-made runs of data/runs; and the page they sit in, as headless Chromium shows it."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record

from mtpmatrix.core.schema import KNOWN_UPSTREAM
from mtpmatrix.report import figures
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary
from mtpmatrix.report.cli import write_report

pytest.importorskip("matplotlib", reason="the figures need matplotlib (the 'report' extra; nox -s unit installs it)")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "report_screenshot.py"
BASE, CUR, CPU = "20261201-090512", "20261208-090507", "20261209-140233"


def _figure(html: str, fid: str) -> str:
    """The <figure> of figure ``fid`` in the page; fails when it is not there."""
    got = re.search(rf'<figure id="fig-{fid}">.*?</figure>', html, re.S)
    assert got, f"figure {fid} is not on the page"
    return got.group(0)


def _texts(svg: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text\b[^>]*>(.*?)</text>", svg, re.S)]


def _record_values(metric: str) -> dict[str, float]:
    """{smoke server: the metric's value} read straight off the H200 record, the last check that recorded it winning
    (as the report's metric rows merge a server's checks)."""
    out: dict[str, float] = {}
    for chk in h200_record()["tiers"]["smoke"]["checks"]:
        value = (chk.get("metrics") or {}).get(metric)
        if isinstance(value, (int, float)):
            out[chk["id"].split("[", 1)[1].rstrip("]")] = value
    return out


@pytest.fixture
def h200_page(h200_run):
    results, run = h200_run
    summary = report_summary.build_summary(run)
    return summary, report_render.render_html(summary)


def test_the_h200_record_draws_its_figures_inline_and_self_contained(h200_page):
    _, html = h200_page
    for fid in ("accept", "decoy", "launch"):
        assert "<svg" in _figure(html, fid)
    # nothing fetched: no script, stylesheet or image from anywhere, and an SVG only points inside itself
    assert "<script" not in html and "<link" not in html and "<img" not in html and " src=" not in html
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', svg))
    assert "GSM8K score, 95% Wilson interval, against the threshold: no GSM8K score recorded" in html


def test_the_accept_figure_carries_the_record_s_accept_lengths_and_floors(h200_page):
    summary, html = h200_page
    accept = _figure(html, "accept")
    per_request = _record_values("accept_length_requests")
    labels = _texts(accept)
    for server, value in per_request.items():
        assert figures._num(value) in labels, (server, value)
    # the gated value (requests), not the server's own average (random-mtp-topk3 1.0105, sampled-mtp-topk1 1.196)
    assert "1.01" not in labels and "1.196" not in labels
    points = {p["case"]: p for f in figures.build(summary) if f["id"] == "accept" for p in f["points"]}
    assert set(points) == set(per_request)
    assert points["witness-mtp-topk1"]["floor"] == 5.3333 and points["random-mtp-topk3"]["floor"] == 1.0
    assert points["decoy-mtp-topk1"]["floor"] is None  # each request's own is predicted: the decoy figure
    assert "no floor drawn for decoy-mtp-topk1, decoy-mtp-topk3, decoy-mtp-topk3-no-overlap: each request" in html
    # the transformers-phase witness fails only on the known draft-phase deviation: drawn in that colour, alone
    assert points["witness-transformers-phase-topk1"]["status"] == KNOWN_UPSTREAM
    assert [p["status"] for p in points.values()].count(KNOWN_UPSTREAM) == 1
    assert figures.COLOURS[KNOWN_UPSTREAM] in accept


def test_the_decoy_and_launch_figures_carry_the_record_s_numbers(h200_page):
    _, html = h200_page
    decoy = " ".join(_texts(_figure(html, "decoy")))
    predicted = _record_values("predicted_accept_lengths")  # lists: none
    assert not predicted
    assert decoy.count("8/8 as predicted") == 3  # decoy-mtp-topk1, -topk3, -topk3-no-overlap
    launch = _texts(_figure(html, "launch"))
    launches = _record_values("launch_seconds")
    assert f"{figures._num(launches['random-nomtp'])} s" in launch
    assert "whole suite" not in launch  # the box shipped no smoke-launch-budget.json: no ratio drawn


def test_the_launch_ratio_is_drawn_against_its_limit_where_the_row_holds_it(h200_run):
    import json

    results, run = h200_run
    budget = {"suite_seconds": 154.4, "servers": 11, "first_wave": 11, "cold_launch_seconds": 132.3}
    budget.update(cold_launches=[132.3], limit=1.5, ratio=1.17)  # the H200's 0.5.17 default suite (2026-12-01b)
    (run / H200_ROW / "smoke-launch-budget.json").write_text(json.dumps(budget))
    summary = report_summary.build_summary(run)
    launch = " ".join(_texts(_figure(report_render.render_html(summary), "launch")))
    assert "154.4 s = 1.17 × cold launch 132.3 s (limit 1.5)" in launch
    assert f"| smoke suite / one cold launch | {H200_ROW} | 14 servers | 1.17 (154.4 s / 132.3 s) | 1.5 |" in (
        report_render.render_markdown(summary)
    )


def test_the_same_summary_draws_the_same_bytes(h200_page):
    summary, html = h200_page
    assert report_render.render_html(summary) == html


def test_gsm8k_scores_intervals_and_the_baseline_figure(results):
    summary = report_summary.build_summary(results / CUR, baseline_dir=results / BASE)
    html = report_render.render_html(summary)
    gsm8k = _figure(html, "gsm8k")
    labels = " ".join(_texts(gsm8k))
    # sglang-0.5.23 E4B-topk1: 0.575 [0.5057, 0.6415] below its threshold 0.65, failed
    assert "0.575 [0.506, 0.641]" in labels and "0.735 [0.67, 0.791]" in labels and "0.48" in labels
    assert figures.COLOURS["failed"] in gsm8k
    base = " ".join(_texts(_figure(html, "baseline")))
    assert "0.685 → 0.575" in base  # sglang-0.5.23's score against 20261201-090512
    md = report_render.render_markdown(summary)
    assert "| GSM8K score | sglang-0.5.23 | E4B-topk1 | ❌ 0.575 [0.506, 0.641] | 0.65 |" in md
    assert "| GSM8K score, vs baseline | sglang-0.5.23 | test_accuracy[E4B-topk1] | 0.685 → 0.575 | — |" in md


def test_a_figure_without_data_is_one_sentence(results):
    html = report_render.render_html(report_summary.build_summary(results / CPU))
    assert "<figure" not in html
    assert "Accept length against its floor: no accept length recorded" in html
    assert "no smoke launch recorded (the smoke tier did not run)." in html


def test_without_matplotlib_the_page_says_why_in_one_line_and_the_numbers_stay(h200_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    results, run = h200_run
    summary, paths = write_report(results, run.name)
    html = paths["html"].read_text()
    assert html.count(figures.NO_MATPLOTLIB) == 1 and "<svg" not in html
    assert f"| accept length (requests) | {H200_ROW} | smoke · witness-mtp-topk1 | ✅ 5.333 | 5.333 |" in (
        paths["md"].read_text()
    )


def test_the_page_reads_at_a_glance(h200_page):
    summary, html = h200_page
    cell = re.search(r'<td class="v known-upstream"[^>]*>(.*?)</td>', html, re.S).group(
        1
    )  # what it shows, not its title
    assert cell.count("sglang 0.5.17") == 1  # once, however many known-upstream entries the tier hit
    hit = {k["id"] for r in summary["rows"] for t in r["tiers"].values() for k in t.get("known_upstream") or []}
    assert len(hit) > 1  # the 0.5.17 record hits several entries: the section sums them in one line
    assert re.search(rf'<details class="section"><summary>Known upstream: {len(hit)} listed issues hit', html)
    assert '<details class="kv"><summary>' in html  # a case's other metrics folded
    # the verdict, the matrix and the figures before the long sections
    assert html.index('class="banner') < html.index("<table") < html.index("<h2>Figures") < html.index("Known upstream")
    assert "report.html" in report_render.render_markdown(summary)


@pytest.mark.skipif(
    not any(map(shutil.which, ("chromium", "chromium-browser"))), reason="no chromium (apt-get install chromium)"
)
def test_headless_chromium_shows_a_page_not_a_blank(tmp_path):
    """The H200 record's report.html as Chromium renders it: a page of many colours, not an empty or error one."""
    spec = importlib.util.spec_from_file_location("report_screenshot", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--out", str(tmp_path / "report")]) == 0
    png = tmp_path / "report" / "report.png"
    assert bench.colours(png) is None or bench.colours(png) >= bench.MIN_COLOURS
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    bench.screenshot(bench.chromium(), blank, tmp_path / "blank.png")
    assert bench.colours(tmp_path / "blank.png") in (None, 1)  # what the check tells a page from


def test_the_package_imports_without_matplotlib():
    """Row venvs get the package but not matplotlib: the report's modules import without it (drawn on first use)."""
    import os
    import subprocess

    src = Path(__file__).resolve().parents[2] / "src"
    code = "import sys; sys.modules['matplotlib'] = None; import mtpmatrix.report.cli, mtpmatrix.__main__; print('ok')"
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}
    )
    assert got.stdout == "ok\n", got.stderr
