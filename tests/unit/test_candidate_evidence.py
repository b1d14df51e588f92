"""evidence/judge.py on candidate rows: a wheel's or checkout's sglang is held to the candidate's version (every other
pin still to the row's), the patch a GPU box served at import and a declared draft phase are the candidate's identity
(on any other record they are knobs that change what is tested), and the plan must name the same candidate."""

from __future__ import annotations

import pytest

from mtpmatrix.core.evidence import judge, manifest

PINS = {"sglang": "0.5.17", "transformers": "5.12.1", "torch": "2.11.0"}
SHA = "ab" * 32


def record(candidate=None, versions=None, knobs=None, rid="sglang-0.5.17+x") -> dict:
    out = {
        "row": {"id": rid, "pins": dict(PINS)},
        "versions": dict(versions or PINS),
        "tiers": {},
        "knobs": dict(knobs or {}),
        "selection": {"knobs": dict(knobs or {}), "args": []},
    }
    if candidate is not None:
        out["candidate"] = dict(candidate, base_row="sglang-0.5.17")
    return out


def problems(rec: dict, plan: dict | None = None) -> list[str]:
    return [p["what"] for p in judge.judge_row(rec["row"]["id"], rec, run_id="r", manifest=plan)]


@pytest.mark.parametrize("kind", ["wheel", "checkout"])
def test_a_wheel_or_checkout_is_held_to_its_own_sglang_version(kind):
    cand = {"kind": kind, "sha256": SHA, "version": "0.5.18.dev0"}
    built = {**PINS, "sglang": "0.5.18.dev0"}
    assert problems(record(cand, built)) == []
    assert problems(record(cand, {**built, "sglang": "0.5.18.dev1"})) == [
        "sglang 0.5.18.dev1 ran, the candidate is 0.5.18.dev0"
    ]
    assert problems(record(cand, PINS)) == ["sglang 0.5.17 ran, the candidate is 0.5.18.dev0"]  # the pin: not it
    # every other pin still holds
    assert problems(record(cand, {**built, "transformers": "5.19.0"})) == [
        "transformers 5.19.0 ran, the row pins 5.12.1"
    ]


def test_a_patch_or_a_plain_row_keeps_the_pin():
    assert problems(record({"kind": "patch", "sha256": SHA}, {**PINS, "sglang": "0.5.18.dev0"})) == [
        "sglang 0.5.18.dev0 ran, the row pins 0.5.17"
    ]
    assert problems(record(None, {**PINS, "sglang": "0.5.18.dev0"})) == ["sglang 0.5.18.dev0 ran, the row pins 0.5.17"]


BOX_KNOBS = {"MTPMATRIX_PATCH": "/box/fix.patch", "MTPMATRIX_PATCH_SHA256": SHA}


def test_the_patch_served_at_import_is_the_candidates_identity():
    assert problems(record({"kind": "patch", "sha256": SHA}, knobs=BOX_KNOBS)) == []


def test_a_patch_knob_that_is_not_the_candidates_is_not_the_qualification_suite():
    other = problems(record({"kind": "patch", "sha256": "cd" * 32}, knobs=BOX_KNOBS))
    plain = problems(record(None, knobs=BOX_KNOBS, rid="sglang-0.5.17"))
    for found in (other, plain):
        assert "smoke ran with MTPMATRIX_PATCH=/box/fix.patch: not the qualification suite" in found
        assert f"contract ran with MTPMATRIX_PATCH_SHA256={SHA}: not the qualification suite" in found


def test_a_declared_draft_phase_is_the_candidates_only():
    knobs = {"MTPMATRIX_DRAFT_PHASE": "+1"}
    assert problems(record({"kind": "patch", "sha256": SHA, "draft_phase": 1}, knobs=knobs)) == []
    assert "smoke ran with MTPMATRIX_DRAFT_PHASE=+1: not the qualification suite" in problems(
        record({"kind": "patch", "sha256": SHA, "draft_phase": -1}, knobs=knobs)
    )
    assert "smoke ran with MTPMATRIX_DRAFT_PHASE=+1: not the qualification suite" in problems(
        record(None, knobs=knobs, rid="sglang-0.5.17")
    )


def test_the_plan_must_name_the_same_candidate():
    cand = {"kind": "patch", "sha256": SHA}
    rec = record(cand)
    planned = {
        "rows": {
            rec["row"]["id"]: manifest.planned_row(rec["row"], candidate=manifest.candidate_identity(rec["candidate"]))
        },
        "invocation": {"overrides": []},
    }
    assert problems(rec, planned) == []
    other = record({"kind": "patch", "sha256": "cd" * 32})
    assert problems(other, planned) == ["the record's candidate is not the one the run planned"]
    release = record(None)
    assert problems(release, planned) == ["the record's candidate is not the one the run planned"]
