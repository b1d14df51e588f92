"""mtpmatrix.report on hand-made runs in tests/unit/data/runs (copied to tmp: the report writes into the run).

20261201-090512  baseline, GPU box: three rows, every check that ran passed, but only E4B (and 26B-A4B topk 1 in
                 0.5.17) of the GSM8K seed cases and two smoke servers ran: partial, never QUALIFIES
20261208-090507  sglang-0.5.23 breaks (args in contract, accuracy in gsm8k), sglang-0.5.23-cu130 does not install
20261209-140233  CPU box: GPU tiers skipped, a harness error in sglang-0.5.13, sglang-0.5.23 never finished
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from mtpmatrix.__main__ import main
from mtpmatrix.core import stats, store
from mtpmatrix.report import closest as report_closest
from mtpmatrix.report import compare as report_compare
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary

BASE, CUR, CPU = "20261201-090512", "20261208-090507", "20261209-140233"


def _summary(results, run_id, baseline=None):
    return report_summary.build_summary(results / run_id, baseline_dir=results / baseline if baseline else None)


def _row(summary, rid):
    return next(r for r in summary["rows"] if r["id"] == rid)


# --- the CLI: files, exit codes ---------------------------------------------------------------------------------


def test_failing_run_writes_three_files_and_exits_1(results, capsys):
    assert main(["report", CUR, "--results", str(results)]) == 1
    out = results / CUR / "report"
    assert {p.name for p in out.iterdir()} == {"summary.md", "report.html", "summary.json"}
    data = json.loads((out / "summary.json").read_text())
    assert data["qualifies"] is False
    # the GPU tiers ran a fraction of their expected sets (two smoke servers, one or two GSM8K seed cases): partial
    assert data["row_verdicts"] == {
        "sglang-0.5.13": "partial",
        "sglang-0.5.17": "partial",
        "sglang-0.5.23": "failed",
        "sglang-0.5.23-cu130": "failed",
    }
    assert data["tier_verdicts"]["sglang-0.5.23"] == {
        "contract": "failed",
        "reference": "passed",
        "smoke": "partial",
        "gsm8k": "failed",
    }
    assert data["regressions"] == []  # no baseline given
    assert "DOES NOT QUALIFY" in capsys.readouterr().out


def test_a_run_where_nothing_failed_but_the_gpu_tiers_ran_in_part_exits_3_and_does_not_qualify(results):
    assert main(["report", BASE, "--results", str(results)]) == report_summary.EXIT_NOT_PROVEN
    s = json.loads((results / BASE / "report" / "summary.json").read_text())
    assert s["qualifies"] is False and s["verdict"] == "not-proven"
    missing = {m["what"] for m in _row(s, "sglang-0.5.13")["tiers"]["gsm8k"]["missing"]}
    assert {"31B-topk1", "31B-topk3", "26B-A4B-topk1"} <= missing


def test_latest_run_is_the_default_and_bisect_runs_are_not_matrix_runs(results):
    probe = results / "bisect-20991231-000000" / "sglang-0.5.17-transformers-5.9.0"
    probe.mkdir(parents=True)
    (probe / "row.json").write_text(json.dumps({"verdict": "passed", "row": {"id": "x"}}))
    assert store.latest_run_id(results) == CPU
    # the CPU run has a pending row and a harness error: nothing failed sglang, nothing is proven
    assert main(["report", "--results", str(results)]) == report_summary.EXIT_NOT_PROVEN
    assert (results / CPU / "report" / "report.html").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["report", "20990101-000000"], "no such run '20990101-000000'"),
        (["report", CUR, "--baseline", "nope"], "no such run 'nope'"),
    ],
)
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
    md = report_render.render_markdown(s)
    assert "| **sglang-0.5.23** | 0.5.23 | 5.19.0 | 2.14.1 | 3.11.7 | — | ❌ failed · args | ✅ passed |" in md
    assert "| **sglang-0.5.23-cu130** | 0.5.23 (pin) |" in md and "❌ install" in md
    assert "first frame `sglang/srt/server_args.py:2214 in _handle_speculative_decoding`" in md
    assert "raised at `tests/tiers/test_gsm8k.py:88 in test_accuracy`" in md
    # skip reasons: one line per distinct reason, tier prefix stripped, rows counted
    assert "- gsm8k in 3 rows (3 checks): E2B threshold not calibrated" in md
    assert "0.575 [0.506, 0.641] (n=200)" in md


def test_cpu_run_groups_gpu_skips_and_flags_harness_and_unfinished(results):
    s = _summary(results, CPU)
    assert s["qualifies"] is False
    # a harness error and an unfinished row prove nothing either way: not proven (exit 3), never "fails" (exit 1)
    assert s["incomplete_rows"] == ["sglang-0.5.23"] and s["failing_rows"] == []
    assert (s["verdict"], s["exit_status"]) == ("not-proven", report_summary.EXIT_NOT_PROVEN)
    assert s["row_verdicts"]["sglang-0.5.13"] == "error"
    gpu = next(g for g in s["skips"] if g["reason"].startswith("needs 1 CUDA GPU"))
    assert gpu["tiers"] == ["smoke", "gsm8k"] and gpu["rows"] == ["sglang-0.5.13", "sglang-0.5.17"]
    md = report_render.render_markdown(s)
    assert "- smoke/gsm8k in 2 rows: needs 1 CUDA GPU(s), this machine has 0" in md
    assert "💥 error · harness" in md and "not proven in sglang-0.5.13" in md
    html = report_render.render_html(s)
    assert "pending" in html and "KeyError" in html


def test_all_skipped_run_does_not_qualify(tmp_path):
    run = tmp_path / "20260101-000000" / "sglang-0.5.17"
    run.mkdir(parents=True)
    tiers = {
        t: {"verdict": "skipped", "reason": "no tests collected for this tier", "checks": []}
        for t in ("contract", "reference", "smoke", "gsm8k")
    }
    (run / "row.json").write_text(
        json.dumps(
            {
                "row": {"id": "sglang-0.5.17", "pins": {}},
                "verdict": "skipped",
                "install": {"verdict": "passed"},
                "tiers": tiers,
            }
        )
    )
    s = report_summary.build_summary(run.parent)
    assert s["qualifies"] is False and s["nothing_ran"] is True
    assert "nothing ran" in report_render.render_markdown(s)


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
    assert "closest passing row: **sglang-0.5.17**, 8 package(s) differ" in report_render.render_markdown(s)


def test_closest_passing_ties_go_to_the_same_sglang():
    target = {"sglang": "0.5.23", "transformers": "5.20.0", "torch": "2.14.1"}
    cands = {
        "a-row": {"sglang": "0.5.17", "transformers": "5.20.0", "torch": "2.14.1"},
        "b-row": {"sglang": "0.5.23", "transformers": "5.19.0", "torch": "2.14.1"},
    }
    got = report_closest.closest_passing(
        target, cands, target_sglang="0.5.23", sglang_of={"a-row": "0.5.17", "b-row": "0.5.23"}
    )
    assert got["row"] == "b-row" and got["differences"] == [
        {"package": "transformers", "this": "5.20.0", "other": "5.19.0"}
    ]
    assert report_closest.closest_passing(target, {}, target_sglang=None, sglang_of={}) is None


def test_parse_freeze():
    text = (
        "Torch==2.11.0\nflash_attn-4==4.0.0b19\n-e file:///x\nsome-pkg @ file:///wheels/s.whl\n"
        "gemma4-mtp-matrix @ file:///src/gemma4-mtp-matrix\n# comment\n"
    )
    assert store.parse_freeze(text) == {
        "torch": "2.11.0",
        "flash-attn-4": "4.0.0b19",
        "some-pkg": "file:///wheels/s.whl",
    }


def test_gsm8k_paired_comparison_between_rows(results):
    s = _summary(results, CUR)
    pairs = {(p["key"], p["row_a"], p["row_b"]): p for p in s["paired"]}
    p = pairs[("E4B-topk1", "sglang-0.5.17", "sglang-0.5.23")]
    assert (p["n"], p["a_correct"], p["b_correct"]) == (200, 138, 115)
    assert (p["right_in_a_only"], p["right_in_b_only"]) == (28, 5)
    assert len(p["flipped_to_wrong"]) == 28 and p["flipped_to_right"] == [24, 67, 76, 94, 173]
    assert p["p_value"] == pytest.approx(6.6188e-05, rel=1e-4)  # exact McNemar, 28 vs 5 (test_private_statistics)
    assert ("E4B-topk1", "sglang-0.5.13", "sglang-0.5.17") in pairs
    assert not any(k == "26B-A4B-topk1" for k, _, _ in pairs)  # only 0.5.17 ran it: nothing to pair with


def test_wilson_from_metrics_or_records(results):
    s = _summary(results, CUR)
    m = {(x["tier"], x["short"]): x for x in _row(s, "sglang-0.5.17")["metrics"]}
    e4b = m[("gsm8k", "E4B-topk1")]
    assert e4b["ci"] == pytest.approx([0.6228, 0.75]) and e4b["n"] == 200
    # one row per case: test_accuracy's score next to test_acceptance's accept length
    assert e4b["accept_length"] == 3.12 and e4b["speedup"] == 1.84
    assert e4b["checks"] == [
        "tests/tiers/test_gsm8k.py::test_accuracy[E4B-topk1]",
        "tests/tiers/test_gsm8k.py::test_acceptance[E4B-topk1]",
    ]
    # no interval or count in the metrics: both from the per-question records the check names
    a26 = m[("gsm8k", "26B-A4B-topk1")]
    assert a26["n"] == 200 and a26["ci"] == pytest.approx(list(stats.wilson_interval(96, 200)))
    assert a26["accept_length"] == 2.71 and a26["speedup"] == 1.52
    assert m[("smoke", "mtp-tiny-topk1")]["accept_length"] == 1.03
    md = report_render.render_markdown(s)
    assert "| sglang-0.5.17 | gsm8k | E4B-topk1 | 0.690 [0.623, 0.750] (n=200) | 3.12 | 1.84× |" in md


def test_private_statistics():
    assert stats.mcnemar(0, 0) == 1.0
    assert stats.mcnemar(5, 0) == pytest.approx(0.0625)
    assert stats.mcnemar(3, 3) == 1.0
    lo, hi = stats.wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    assert stats.wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    # 28 vs 5 discordant pairs: 2 * P(X <= 5), X ~ Binomial(33, 1/2) = 2 * 284,274 / 2**33, summed here with exact
    # fractions along the pmf's recurrence (not math.comb, as stats does)
    tail, pmf = Fraction(0), Fraction(1, 2**33)
    for k in range(6):
        tail, pmf = tail + pmf, pmf * (33 - k) / (k + 1)
    assert 2 * tail == Fraction(142137, 2147483648)
    assert stats.mcnemar(28, 5) == pytest.approx(float(2 * tail), rel=1e-12) == pytest.approx(6.6188e-05, rel=1e-4)


def test_unknown_and_odd_metrics_do_not_crash(results):
    f = results / CUR / "sglang-0.5.17" / "row.json"
    rec = json.loads(f.read_text())
    chk = rec["tiers"]["smoke"]["checks"][0]
    chk["metrics"].update(
        {
            "nested": {"a": 1},
            "strings": ["x", "y"],
            "none": None,
            "nan": math.nan,
            "flag": True,
            "score": "n/a",
            "speedup": math.inf,
            "long": "x" * 500,
            "wilson95": [0.1],
        }
    )
    rec["tiers"]["gsm8k"]["checks"][0]["metrics"]["records"] = "/nowhere/missing.jsonl"
    f.write_text(json.dumps(rec))
    assert main(["report", CUR, "--results", str(results)]) == 1
    html = (results / CUR / "report" / "report.html").read_text()
    assert "nested" in html and "2 items" in html


def test_malformed_jsonl_lines_are_skipped(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"index": 0, "correct": true}\nnot json\n{"index": 1}\n\n{"index": 2, "correct": 0}\n')
    # "correct" is a JSON boolean (schema.RECORD_FIELDS): 0 is an edited line, counted as missing
    assert store.read_question_records(p) == {0: True}


def test_baseline_diff(results):
    s = _summary(results, CUR, baseline=BASE)
    b = s["baseline"]
    assert b["run_id"] == BASE and b["new_rows"] == ["sglang-0.5.23-cu130"] and b["missing_rows"] == []
    rows = {r["row"]: r for r in b["rows"]}
    assert rows["sglang-0.5.23"]["change"] == "worse"
    assert rows["sglang-0.5.23"]["tiers"]["contract"] == {
        "before": "passed",
        "after": "failed",
        "change": "worse",
        "label": "new failure",
    }
    assert rows["sglang-0.5.17"]["change"] == "same"
    new = {(i["row"], i["tier"], i["check"]) for i in b["new_failures"]}
    assert ("sglang-0.5.23", "contract", "tests/tiers/test_contract.py::test_server_args_resolution[topk1]") in new
    assert ("sglang-0.5.23-cu130", "install", None) in new
    assert b["fixed"] == []
    score = next(d for d in b["metric_deltas"] if d["row"] == "sglang-0.5.23" and d["metric"] == "score")
    assert score["delta"] == pytest.approx(-0.11)
    drop = next(r for r in s["regressions"] if r["why"] == "significant accuracy drop")
    assert drop["row"] == "sglang-0.5.23" and drop["p_value"] < 0.001
    md = report_render.render_markdown(s)
    assert "## Compared with baseline `20261201-090512`" in md and "4 new failure(s), 0 fixed" in md
    assert "3 of 4 check(s) answered identically" in md


def test_baseline_in_the_other_direction_reports_fixes(results):
    s = report_summary.build_summary(results / BASE, baseline_dir=results / CUR)
    b = s["baseline"]
    assert {i["check"] for i in b["fixed"]} >= {"tests/tiers/test_contract.py::test_server_args_resolution[topk3]"}
    assert b["missing_rows"] == ["sglang-0.5.23-cu130"] and s["regressions"] == []


def test_change_labels():
    assert report_compare._change("passed", "failed") == ("worse", "new failure")
    assert report_compare._change("failed", "passed") == ("better", "fixed")
    assert report_compare._change("failed", "error") == ("same", "still failing")
    assert report_compare._change("skipped", "passed") == ("better", "now runs whole and passes")
    assert report_compare._change("passed", "skipped") == ("worse", "no longer runs")
    assert report_compare._change("passed", "partial") == ("worse", "now partial")
    assert report_compare._change("partial", "passed") == ("better", "now runs whole and passes")
    assert report_compare._change(None, "failed") == ("worse", "new row, failing")


def test_html_is_one_self_contained_page(results):
    s = _summary(results, CUR, baseline=BASE)
    html = report_render.render_html(s)
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
    checks = [
        {
            "id": f"tests/tiers/test_smoke.py::{name}[random-nomtp]",
            "tier": "smoke",
            "outcome": "passed",
            "metrics": dict(m),
        }
        for name in ("test_server_serves", "test_spec_metrics")
    ]
    checks.append(
        {
            "id": "tests/tiers/test_smoke.py::test_server_serves[random-mtp-topk3]",
            "tier": "smoke",
            "outcome": "passed",
            "metrics": {"server_log": "/box/out/work/server-random-mtp-topk3.log"},
        }
    )
    tiers = {"smoke": {"verdict": "passed", "checks": checks}}
    (run / "row.json").write_text(
        json.dumps(
            {
                "row": {"id": "sglang-0.5.17", "pins": {}},
                "verdict": "passed",
                "install": {"verdict": "passed"},
                "tiers": tiers,
            }
        )
    )
    s = report_summary.build_summary(run.parent)
    entry = {
        "tier": "smoke",
        "server": "random-nomtp",
        "server_log": "server-random-nomtp-alone.log",
        "error": err,
        "checks": ["test_server_serves", "test_spec_metrics"],
        "alone": "passed",
    }
    assert _row(s, "sglang-0.5.17")["relaunched"] == [entry]
    assert s["relaunched"] == [dict(entry, row="sglang-0.5.17")]
    md = report_render.render_markdown(s)
    assert "**Relaunched alone**" in md
    # the first error sits next to the server and the checks it stands behind, and how they ended alone
    assert (
        "- sglang-0.5.17 · smoke · `random-nomtp`: test_server_serves, test_spec_metrics passed alone "
        f"(`server-random-nomtp-alone.log`); first error beside other servers: {err}"
    ) in md
    html = report_render.render_html(s)
    assert "server-random-nomtp-alone.log" in html and "test_server_serves, test_spec_metrics passed alone" in html
