"""mtpmatrix.report on hand-made runs in tests/unit/data/runs (copied to tmp: the report writes into the run).

20261201-090512  baseline, GPU box: three rows, every tier passed
20261208-090507  sglang-0.5.23 breaks (args in contract, accuracy in gsm8k), sglang-0.5.23-cu130 does not install
20261209-140233  CPU box: GPU tiers skipped, a harness error in sglang-0.5.13, sglang-0.5.23 never finished
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from mtpmatrix import report
from mtpmatrix.__main__ import main

DATA = Path(__file__).parent / "data" / "runs"
BASE, CUR, CPU = "20261201-090512", "20261208-090507", "20261209-140233"


@pytest.fixture
def results(tmp_path):
    dest = tmp_path / "results"
    shutil.copytree(DATA, dest)
    return dest


def _summary(results, run_id, baseline=None):
    return report.build_summary(results / run_id, baseline_dir=results / baseline if baseline else None)


def _row(summary, rid):
    return next(r for r in summary["rows"] if r["id"] == rid)


# --- the CLI: files, exit codes ---------------------------------------------------------------------------------

def test_failing_run_writes_three_files_and_exits_1(results, capsys):
    assert main(["report", CUR, "--results", str(results)]) == 1
    out = results / CUR / "report"
    assert {p.name for p in out.iterdir()} == {"summary.md", "report.html", "summary.json"}
    data = json.loads((out / "summary.json").read_text())
    assert data["qualifies"] is False
    assert data["row_verdicts"] == {"sglang-0.5.13": "passed", "sglang-0.5.17": "passed",
                                    "sglang-0.5.23": "failed", "sglang-0.5.23-cu130": "failed"}
    assert data["tier_verdicts"]["sglang-0.5.23"] == {"contract": "failed", "reference": "passed",
                                                      "smoke": "passed", "gsm8k": "failed"}
    assert data["regressions"] == []  # no baseline given
    assert "DOES NOT QUALIFY" in capsys.readouterr().out


def test_passing_run_exits_0(results):
    assert main(["report", BASE, "--results", str(results)]) == 0
    assert json.loads((results / BASE / "report" / "summary.json").read_text())["qualifies"] is True


def test_latest_run_is_the_default_and_bisect_runs_are_not_matrix_runs(results):
    probe = results / "bisect-20991231-000000" / "sglang-0.5.17-transformers-5.9.0"
    probe.mkdir(parents=True)
    (probe / "row.json").write_text(json.dumps({"verdict": "passed", "row": {"id": "x"}}))
    assert report.latest_run_id(results) == CPU
    assert main(["report", "--results", str(results)]) == 1  # the CPU run has a pending row
    assert (results / CPU / "report" / "report.html").exists()


@pytest.mark.parametrize("args, words", [
    (["report", "20990101-000000"], "no such run '20990101-000000'"),
    (["report", CUR, "--baseline", "nope"], "no such run 'nope'"),
])
def test_bad_input_exits_2_with_one_line(results, capsys, args, words):
    assert main(args + ["--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_no_runs_at_all_exits_2(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "empty")]) == 2
    assert "no runs under" in capsys.readouterr().err


def test_run_without_rows_exits_2(tmp_path, capsys):
    (tmp_path / "20260101-000000").mkdir()
    assert main(["report", "20260101-000000", "--results", str(tmp_path)]) == 2
    assert "has no rows" in capsys.readouterr().err


def test_out_dir_and_github_step_summary(results, tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    assert main(["report", CUR, "--results", str(results), "--out", str(tmp_path / "out")]) == 1
    md = (tmp_path / "out" / "summary.md").read_text()
    text = step.read_text()
    assert text.startswith("earlier step\n") and md in text
    # links are relative to wherever the page was written
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'href="../results/20261208-090507/sglang-0.5.23/pytest.log"' in html


# --- content --------------------------------------------------------------------------------------------------

def test_markdown_table_versions_failures_and_skips(results):
    s = _summary(results, CUR)
    md = report.render_markdown(s)
    assert "| **sglang-0.5.23** | 0.5.23 | 5.19.0 | 2.14.1 | 3.11.7 | — | ❌ failed · args | ✅ passed |" in md
    assert "| **sglang-0.5.23-cu130** | 0.5.23 (pin) |" in md and "❌ install" in md
    assert "first frame `sglang/srt/server_args.py:2214 in _handle_speculative_decoding`" in md
    assert "raised at `tests/tiers/test_gsm8k.py:88 in test_gsm8k_accuracy`" in md
    # skip reasons: one line per distinct reason, tier prefix stripped, rows counted
    assert "- gsm8k in 3 rows (3 checks): E2B threshold not calibrated" in md
    assert "0.575 [0.506, 0.641] (n=200)" in md


def test_cpu_run_groups_gpu_skips_and_flags_harness_and_unfinished(results):
    s = _summary(results, CPU)
    assert s["qualifies"] is False
    assert s["incomplete_rows"] == ["sglang-0.5.23"] and s["failing_rows"] == ["sglang-0.5.13"]
    assert s["row_verdicts"]["sglang-0.5.13"] == "error"
    gpu = next(g for g in s["skips"] if g["reason"].startswith("needs 1 CUDA GPU"))
    assert gpu["tiers"] == ["smoke", "gsm8k"] and gpu["rows"] == ["sglang-0.5.13", "sglang-0.5.17"]
    md = report.render_markdown(s)
    assert "- smoke/gsm8k in 2 rows: needs 1 CUDA GPU(s), this machine has 0" in md
    assert "💥 error · harness" in md and "unfinished: sglang-0.5.23" in md
    html = report.render_html(s)
    assert "pending" in html and "KeyError" in html


def test_all_skipped_run_does_not_qualify(tmp_path):
    run = tmp_path / "20260101-000000" / "sglang-0.5.17"
    run.mkdir(parents=True)
    tiers = {t: {"verdict": "skipped", "reason": "no tests collected for this tier", "checks": []}
             for t in ("contract", "reference", "smoke", "gsm8k")}
    (run / "row.json").write_text(json.dumps({"row": {"id": "sglang-0.5.17", "pins": {}}, "verdict": "skipped",
                                              "install": {"verdict": "passed"}, "tiers": tiers}))
    s = report.build_summary(run.parent)
    assert s["qualifies"] is False and s["nothing_ran"] is True
    assert "nothing ran" in report.render_markdown(s)


def test_closest_passing_row_from_freeze_and_from_pins(results):
    s = _summary(results, CUR)
    cp = _row(s, "sglang-0.5.23")["closest_passing"]
    assert cp["row"] == "sglang-0.5.17" and cp["source"] == "freeze" and cp["distance"] == 8
    diffs = {d["package"]: (d["this"], d["other"]) for d in cp["differences"]}
    assert diffs["transformers"] == ("5.19.0", "5.12.1") and diffs["nvidia-nccl-cu13"] == ("2.29.3", "2.28.9")
    assert [d["package"] for d in cp["differences"]][:3] == ["sglang", "transformers", "torch"]
    assert "gemma4-mtp-matrix" not in diffs
    cp2 = _row(s, "sglang-0.5.23-cu130")["closest_passing"]
    assert cp2["source"] == "pins" and cp2["distance"] == 3
    assert "closest passing row: **sglang-0.5.17**, 8 package(s) differ" in report.render_markdown(s)


def test_closest_passing_ties_go_to_the_same_sglang():
    target = {"sglang": "0.5.23", "transformers": "5.20.0", "torch": "2.14.1"}
    cands = {"a-row": {"sglang": "0.5.17", "transformers": "5.20.0", "torch": "2.14.1"},
             "b-row": {"sglang": "0.5.23", "transformers": "5.19.0", "torch": "2.14.1"}}
    got = report.closest_passing(target, cands, target_sglang="0.5.23",
                                 sglang_of={"a-row": "0.5.17", "b-row": "0.5.23"})
    assert got["row"] == "b-row" and got["differences"] == [
        {"package": "transformers", "this": "5.20.0", "other": "5.19.0"}]
    assert report.closest_passing(target, {}, target_sglang=None, sglang_of={}) is None


def test_parse_freeze():
    text = "Torch==2.11.0\nflash_attn-4==4.0.0b19\n-e file:///x\nsome-pkg @ file:///wheels/s.whl\n" \
           "gemma4-mtp-matrix @ file:///work/mtp\n# comment\n"
    assert report.parse_freeze(text) == {"torch": "2.11.0", "flash-attn-4": "4.0.0b19",
                                         "some-pkg": "file:///wheels/s.whl"}


def test_gsm8k_paired_comparison_between_rows(results):
    s = _summary(results, CUR)
    pairs = {(p["key"], p["row_a"], p["row_b"]): p for p in s["paired"]}
    p = pairs[("test_gsm8k_accuracy[E4B-topk1]", "sglang-0.5.17", "sglang-0.5.23")]
    assert (p["n"], p["a_correct"], p["b_correct"]) == (200, 138, 115)
    assert (p["right_in_a_only"], p["right_in_b_only"]) == (28, 5)
    assert len(p["flipped_to_wrong"]) == 28 and p["flipped_to_right"] == [24, 67, 76, 94, 173]
    assert p["p_value"] == pytest.approx(report.mcnemar_p(28, 5)) and p["p_value"] < 1e-4
    # 0.5.17's records were named with an absolute path from the GPU box: found in the row's gsm8k/ folder
    assert ("test_gsm8k_accuracy[E4B-topk1]", "sglang-0.5.13", "sglang-0.5.17") in pairs


def test_wilson_from_metrics_or_records(results):
    s = _summary(results, CUR)
    m = {x["short"]: x for x in _row(s, "sglang-0.5.17")["metrics"]}
    e4b = m["test_gsm8k_accuracy[E4B-topk1]"]
    assert e4b["ci"] == [0.623, 0.75] or e4b["ci"] == pytest.approx([0.6227, 0.7504], abs=1e-3)
    # no CI in the metrics: computed from gsm8k/26B-A4B-topk1.jsonl, which no metric names
    a26 = m["test_gsm8k_accuracy[26B-A4B-topk1]"]
    assert a26["n"] == 200 and a26["ci"] == pytest.approx(list(report.wilson(96, 200)))
    assert a26["accept_length"] == 2.71 and a26["speedup"] == 1.52


def test_private_statistics():
    assert report.mcnemar_p(0, 0) == 1.0
    assert report.mcnemar_p(5, 0) == pytest.approx(0.0625)
    assert report.mcnemar_p(3, 3) == 1.0
    lo, hi = report.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    assert report.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert report.mcnemar_p(28, 5) == pytest.approx(report.mcnemar_p(28, 5))


def test_unknown_and_odd_metrics_do_not_crash(results):
    f = results / CUR / "sglang-0.5.17" / "row.json"
    rec = json.loads(f.read_text())
    chk = rec["tiers"]["smoke"]["checks"][0]
    chk["metrics"].update({"nested": {"a": 1}, "strings": ["x", "y"], "none": None, "nan": math.nan, "flag": True,
                           "score": "n/a", "speedup": math.inf, "long": "x" * 500, "wilson95": [0.1]})
    rec["tiers"]["gsm8k"]["checks"][0]["metrics"]["records"] = "/nowhere/missing.jsonl"
    f.write_text(json.dumps(rec))
    assert main(["report", CUR, "--results", str(results)]) == 1
    html = (results / CUR / "report" / "report.html").read_text()
    assert "nested" in html and "2 items" in html


def test_malformed_jsonl_lines_are_skipped(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"index": 0, "correct": true}\nnot json\n{"index": 1}\n\n{"index": 2, "correct": 0}\n')
    assert report.read_question_records(p) == {0: True, 2: False}


def test_baseline_diff(results):
    s = _summary(results, CUR, baseline=BASE)
    b = s["baseline"]
    assert b["run_id"] == BASE and b["new_rows"] == ["sglang-0.5.23-cu130"] and b["missing_rows"] == []
    rows = {r["row"]: r for r in b["rows"]}
    assert rows["sglang-0.5.23"]["change"] == "worse"
    assert rows["sglang-0.5.23"]["tiers"]["contract"] == {"before": "passed", "after": "failed", "change": "worse",
                                                          "label": "new failure"}
    assert rows["sglang-0.5.17"]["change"] == "same"
    new = {(i["row"], i["tier"], i["check"]) for i in b["new_failures"]}
    assert ("sglang-0.5.23", "contract", "tests/tiers/test_contract.py::test_server_args_resolution[topk1]") in new
    assert ("sglang-0.5.23-cu130", "install", None) in new
    assert b["fixed"] == []
    score = next(d for d in b["metric_deltas"] if d["row"] == "sglang-0.5.23" and d["metric"] == "score")
    assert score["delta"] == pytest.approx(-0.11)
    drop = next(r for r in s["regressions"] if r["why"] == "significant accuracy drop")
    assert drop["row"] == "sglang-0.5.23" and drop["p_value"] < 0.001
    md = report.render_markdown(s)
    assert "## Compared with baseline `20261201-090512`" in md and "4 new failure(s), 0 fixed" in md
    assert "3 of 4 check(s) answered identically" in md


def test_baseline_in_the_other_direction_reports_fixes(results):
    s = report.build_summary(results / BASE, baseline_dir=results / CUR)
    b = s["baseline"]
    assert {i["check"] for i in b["fixed"]} >= {"tests/tiers/test_contract.py::test_server_args_resolution[topk3]"}
    assert b["missing_rows"] == ["sglang-0.5.23-cu130"] and s["regressions"] == []


def test_change_labels():
    assert report._change("passed", "failed") == ("worse", "new failure")
    assert report._change("failed", "passed") == ("better", "fixed")
    assert report._change("failed", "error") == ("same", "still failing")
    assert report._change("skipped", "passed") == ("better", "now runs and passes")
    assert report._change("passed", "skipped") == ("worse", "no longer runs")
    assert report._change(None, "failed") == ("worse", "new row, failing")


def test_html_is_one_self_contained_page(results):
    s = _summary(results, CUR, baseline=BASE)
    html = report.render_html(s)
    assert html.startswith("<!DOCTYPE html>") and "<style>" in html
    assert "<link" not in html and "<script" not in html and "http://" not in html and "https://" not in html
    assert 'href="../sglang-0.5.23/install.log"' in html and 'href="../sglang-0.5.23/junit.xml"' in html
    assert "<details open><summary>✗ sglang-0.5.23 — accuracy, args</summary>" in html
    assert 'class="v failed"' in html and 'class="v passed"' in html
    # with a baseline, the same row from the baseline run is the nearest passing neighbour
    assert "Closest passing row: sglang-0.5.23 @ " in html
    assert "&lt;" not in s["run_id"]  # sanity: escaping applies to data, not ids


def test_servers_relaunched_alone_are_listed_once_per_server(tmp_path):
    run = tmp_path / "20260102-000000" / "sglang-0.5.17"
    run.mkdir(parents=True)
    err = "CheckFailure: random-nomtp server exited with code -9 before it was ready (70s after launch)"
    m = {"server_log": "/box/out/work/server-random-nomtp-alone.log", "first_attempt_error": err}
    checks = [{"id": f"tests/tiers/test_smoke.py::{name}[random-nomtp]", "tier": "smoke", "outcome": "passed",
               "metrics": dict(m)} for name in ("test_server_serves", "test_spec_metrics")]
    checks.append({"id": "tests/tiers/test_smoke.py::test_server_serves[random-mtp-topk3]", "tier": "smoke",
                   "outcome": "passed", "metrics": {"server_log": "/box/out/work/server-random-mtp-topk3.log"}})
    tiers = {"smoke": {"verdict": "passed", "checks": checks}}
    (run / "row.json").write_text(json.dumps({"row": {"id": "sglang-0.5.17", "pins": {}}, "verdict": "passed",
                                              "install": {"verdict": "passed"}, "tiers": tiers}))
    s = report.build_summary(run.parent)
    assert _row(s, "sglang-0.5.17")["relaunched"] == [
        {"tier": "smoke", "server_log": "server-random-nomtp-alone.log", "error": err}]
    assert s["relaunched"] == [{"row": "sglang-0.5.17", "tier": "smoke",
                                "server_log": "server-random-nomtp-alone.log", "error": err}]
    assert "**Relaunched alone**" in report.render_markdown(s)
    assert "server-random-nomtp-alone.log" in report.render_html(s)
