"""The report on a candidate: set beside its base release (the same run, or --baseline), check by check -- fixed,
broken, unchanged -- with the known-upstream entries that no longer apply to it; its verdict names it, and exit
codes and --require work as for a release. Built on the real H200 smoke record of sglang 0.5.17 (the draft-phase
check known upstream) and the same record as the draft-phase fix would leave it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.core import schema
from mtpmatrix.report import candidates
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary
from mtpmatrix.runner import importer

SHA = "1a2b3c4" + "0" * 57
CAND = f"{H200_ROW}+patch-{SHA[:7]}"
PHASE_CHECK = "tests/tiers/test_smoke.py::test_draft_phase_matches_transformers[witness-transformers-phase-topk1]"
TOPK3 = "tests/tiers/test_smoke.py::test_spec_metrics[witness-mtp-topk3]"


def fixed_record(break_topk3: bool = False) -> dict:
    """The H200 record as the draft-phase fix leaves it: the transformers-phase witness accepts every draft; with
    ``break_topk3`` the topk-3 witness also collapses (a candidate that broke something)."""
    data = h200_record()
    for chk in data["tiers"]["smoke"]["checks"]:
        if chk["id"] == PHASE_CHECK:
            chk["outcome"] = "passed"
            chk.pop("failure", None)
            chk["metrics"]["accept_length_requests"] = 5.3333
        if chk["id"] == TOPK3 and break_topk3:
            chk["outcome"] = "failed"
            chk["metrics"]["accept_length_requests"] = 1.07
            chk["failure"] = {
                "kind": "acceptance",
                "type": "CheckFailure",
                "message": "accept length 1.07 outside [5.3333, 5.3333]",
            }
    return data


def import_candidate(tmp_path: Path, results: Path, run_id: str, data: dict) -> Path:
    out = tmp_path / f"box-{run_id}"
    write_box(
        out,
        data,
        knobs={"MTPMATRIX_PATCH": "/box/fix.patch", "MTPMATRIX_PATCH_SHA256": SHA, "MTPMATRIX_DRAFT_PHASE": "+1"},
    )
    inv = json.loads((out / schema.INVOCATION_FILE).read_text())
    inv["patch"] = {"path": "/box/fix.patch", "sha256": SHA, "files": ["sglang/srt/x.py"], "draft_phase": 1}
    (out / schema.INVOCATION_FILE).write_text(json.dumps(inv))
    dest, _ = importer.import_run(out, H200_ROW, results=results, run_id=run_id)
    return dest


def import_base(tmp_path: Path, results: Path, run_id: str) -> None:
    importer.import_run(write_box(tmp_path / f"base-{run_id}", h200_record()), H200_ROW, results=results, run_id=run_id)


@pytest.fixture
def results(tmp_path) -> Path:
    return tmp_path / "results"


def test_the_fix_beside_its_base_in_a_baseline_run(tmp_path, results):
    import_base(tmp_path, results, "base")
    import_candidate(tmp_path, results, "cand", fixed_record())
    s = report_summary.build_summary(results / "cand", baseline_dir=results / "base", require=["smoke"])
    (c,) = s["candidates"]
    assert (c["row"], c["base_row"], c["base_from"]) == (CAND, H200_ROW, "baseline base")
    unchanged = len(h200_record()["tiers"]["smoke"]["checks"]) - 1  # every check but the fixed one
    assert c["counts"] == {"fixed": 1, "broken": 0, "unchanged": unchanged}
    assert [(i["check"], i["before_known_upstream"]) for i in c["fixed"]] == [
        (PHASE_CHECK, "sglang-gemma4-mtp-draft-rope-phase")
    ]
    assert [k["id"] for k in c["no_longer_applies"]] == ["sglang-gemma4-mtp-draft-rope-phase"]
    assert not s["stale_known_upstream"]  # the release still has it: no "entry can go"
    # --require works as for a release, and the verdict names the candidate
    assert (s["verdict"], s["exit_status"]) == ("required-proven", 0)
    head = report_render.headline(s)
    assert head.startswith(
        f"candidate {CAND} (patch 1a2b3c4 on {H200_ROW}, draft phase +1 declared): smoke proven in all 1 rows"
    )
    md = report_render.render_markdown(s)
    assert f"1 fixed, 0 broken, {unchanged} unchanged (check by check, against {H200_ROW})" in md
    assert (
        "- 🔺 fixed **smoke** test_draft_phase_matches_transformers[witness-transformers-phase-topk1] (known "
        f"upstream in {H200_ROW}, passes now)"
    ) in md
    assert (
        "- 🧹 known upstream `sglang-gemma4-mtp-draft-rope-phase` no longer applies to the candidate: 1 of its "
        f"checks pass (smoke); {H200_ROW} still has it"
    ) in md
    assert "accept_length_requests: 1.0711 → 5.3333" in md
    assert "can go" not in md
    assert "Candidates" in report_render.render_html(s)
    # the baseline comparison pairs the candidate with its base release, not a "new row" beside a "missing" one
    assert s["baseline"]["new_rows"] == [] and s["baseline"]["missing_rows"] == []


def test_a_candidate_that_breaks_a_check_fails_and_says_which(tmp_path, results):
    import_base(tmp_path, results, "both")  # the base release in the same run
    import_candidate(tmp_path, results, "both", fixed_record(break_topk3=True))
    s = report_summary.build_summary(results / "both", require=["smoke"])
    (c,) = s["candidates"]
    assert c["base_from"] == "this run" and c["counts"] == {
        "fixed": 1,
        "broken": 1,
        "unchanged": len(h200_record()["tiers"]["smoke"]["checks"]) - 2,
    }
    assert [i["check"] for i in c["broken"]] == [TOPK3]
    assert (s["verdict"], s["exit_status"], s["failing_rows"]) == ("fails", 1, [CAND])
    assert report_render.headline(s).startswith(
        f"candidate {CAND} (patch 1a2b3c4 on {H200_ROW}, draft phase +1 "
        f"declared): DOES NOT QUALIFY — 1 of 2 rows failing: {CAND}"
    )
    assert (
        "- 🔻 broken **smoke** test_spec_metrics[witness-mtp-topk3]: `acceptance` accept length 1.07 outside"
        in report_render.render_markdown(s)
    )


def test_a_candidate_without_its_base_says_how_to_get_one(tmp_path, results):
    import_candidate(tmp_path, results, "alone", fixed_record())
    s = report_summary.build_summary(results / "alone", require=["smoke"])
    (c,) = s["candidates"]
    assert c["missing_base"].startswith(f"no record of {H200_ROW} in this run or a baseline")
    assert c["counts"] == {"fixed": 0, "broken": 0, "unchanged": 0}
    assert [k["id"] for k in c["no_longer_applies"]] == ["sglang-gemma4-mtp-draft-rope-phase"]
    assert s["exit_status"] == 0  # the candidate's own evidence holds


def test_unchanged_counts_the_checks_both_ran_the_same_way():
    base = {
        "tiers": {
            "smoke": {
                "checks": [
                    {"id": "a", "outcome": "passed"},
                    {"id": "b", "outcome": "failed"},
                    {"id": "c", "outcome": "passed"},
                    {"id": "d", "outcome": "skipped"},
                    {"id": "e", "outcome": "skipped"},
                ]
            }
        }
    }
    cur = copy.deepcopy(base)
    cur["tiers"]["smoke"]["checks"][1]["outcome"] = "passed"  # b fixed
    cur["tiers"]["smoke"]["checks"][2]["outcome"] = "failed"  # c broke
    cur["tiers"]["smoke"]["checks"][4]["outcome"] = "passed"  # e ran here only: nothing to compare
    c = candidates.beside(
        "x+patch-1",
        cur,
        {"kind": "patch", "sha256": SHA, "base_row": "x"},
        base,
        "this run",
        Path("/nowhere"),
        Path("/nowhere"),
    )
    assert c["counts"] == {"fixed": 1, "broken": 1, "unchanged": 1}  # a; d and e compare nothing
    assert [i["check"] for i in c["fixed"]] == ["b"] and [i["check"] for i in c["broken"]] == ["c"]


def test_a_planned_candidate_whose_patch_did_not_apply_is_not_run_with_its_line(tmp_path, results):
    """The session plans the candidate's id before it installs; a patch that does not apply leaves no record, and the
    report names the planned candidate as not run, with the line its session gave."""
    from mtpmatrix.core.rows import load_rows
    from mtpmatrix.runner import candidate, matrix, plan

    import_base(tmp_path, results, "r")
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/sglang/srt/x.py\n+++ b/sglang/srt/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    cand = candidate.from_options(str(patch), None, None)
    rid = cand.row_id(H200_ROW)
    rows = {r.id: r for r in load_rows(Path(__file__).resolve().parents[2] / "constraints")}
    opts = matrix.Options(results=results, run_id="r", candidate=cand)
    assert plan.start(opts, rid, plan.planned(rows, [H200_ROW], cand)) is None
    why = "--patch fix.patch: sglang/srt/x.py: hunk 1 (@@ -1 +1 @@) does not apply: line 1 is 'A = 1'"
    plan.not_run(opts, rid, why)
    s = report_summary.build_summary(results / "r")
    assert s["evidence"]["rows"][rid] == [{"tier": None, "what": f"not run: {why}"}]
    assert s["exit_status"] == 3 and rid in report_render.headline(s)
