"""The request-surface known-upstream entries whose check names only its first difference or one label: each still
matches the failures measured on an H200 (docs/runs), and no longer matches another answer of the same request."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import known_upstream
from mtpmatrix.core.atomic import read_json_or_gzip

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
SURFACE_0517 = RUNS / "2026-12-02b-h200-sglang-0.5.17-request-surface-baseline.json.gz"
SMOKE_0513 = RUNS / "2026-12-05b-h200-sglang-0.5.13-smoke-default.json.gz"


def entry(entry_id: str) -> known_upstream.KnownIssue:
    return next(e for e in known_upstream.load() if e.id == entry_id)


def measured(path: Path, check: str) -> dict:
    record = read_json_or_gzip(path)
    return next(c for c in record["tiers"]["smoke"]["checks"] if c["id"].endswith(f"::{check}"))


def altered(check: dict, message: str | None = None, **metrics) -> dict:
    failure = {**check["failure"], **({"message": message} if message else {})}
    return {**check, "failure": failure, "metrics": {**(check.get("metrics") or {}), **metrics}}


@pytest.mark.parametrize(
    "entry_id, check, label",
    [
        (
            "sglang-spec-v2-stop-string-before-stop-token",
            "test_stop_ends_the_output_exactly[witness-mtp-topk1]",
            "eos-before-stop-str",
        ),
        ("sglang-spec-v2-length-before-stop", "test_length_cut_mid_step[witness-mtp-topk1]", "length-eos-before-limit"),
    ],
)
def test_a_stop_order_entry_holds_the_whole_measured_answer(entry_id, check, label):
    """The measured answer matches; the same request answered otherwise (32 tokens of garbage, an abort) does not,
    though its label and note are the same."""
    e, c = entry(entry_id), measured(SURFACE_0517, check)
    assert e.applies_to({"sglang": "0.5.17"}) and e.matches(c, [c])
    head, _, _ = c["failure"]["message"].partition(" output_ids ")
    garbage = (
        f"{head} output_ids [7, 7, 7] (len 32) != predicted [504, 505] (len 10); finish_reason {{'type': 'abort'}}"
    )
    assert not e.matches(altered(c, garbage), [c])


def test_the_min_new_tokens_entry_needs_the_checks_own_words_that_it_is_the_deviation():
    """The check adds '(predicted for intact sglang ...)' only when the whole output is the one intact sglang's verify
    gives; an output of 32 garbage tokens gets the same first words without it."""
    e = entry("sglang-mtp-min-new-tokens-counts-verify-steps")
    c = measured(SURFACE_0517, "test_feature_matches_no_mtp[witness-mtp-topk1-min-new-tokens-released]")
    assert e.matches(c, [c])
    without = c["failure"]["message"].split(" (predicted for intact sglang")[0]
    assert not e.matches(altered(c, without), [c])


def test_the_repetition_boost_entry_holds_both_whole_outputs():
    """0.5.13's measured outputs match; the same first three tokens followed by anything else do not."""
    e = entry("sglang-0513-penalty-feed-differs-by-scheduler")
    c = measured(SMOKE_0513, "test_feature_matches_no_mtp[witness-mtp-topk1-repetition-boost]")
    beside = [{"id": f"tests/tiers/test_smoke.py::{n}", "outcome": "passed"} for n in e.signature["passed_beside"]]
    assert e.applies_to({"sglang": "0.5.13"}) and e.matches(c, [c, *beside])
    tail = c["metrics"]["output_ids"][:4] + [0] * 28
    assert not e.matches(altered(c, output_ids=tail), [c, *beside])
    assert not e.matches(altered(c, output_ids=None), [c, *beside])  # not recorded: the output is unseen
    # equal as Python compares, not as recorded: 392.0 is no token id (types are held too)
    assert not e.matches(altered(c, output_ids=[float(t) for t in c["metrics"]["output_ids"]]), [c, *beside])
