"""meta_fields: the speculative meta_info table per sglang release and how the fields must agree (no sglang).

Responses are built the way sglang builds them (per-request counters bumped per verify step, the tokenizer manager's
ratios on top); the contract tier checks the same against the installed release's own tokenizer manager.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import settings
from mtpmatrix.tiers import smoke
from mtpmatrix.tiers.compat import meta_fields as F

STEPS = settings.NUM_STEPS
DRAFT_TOKENS = settings.DRAFT_TOKENS[1]


def response(accepted: list[int], max_new: int = smoke.MAX_NEW_TOKENS, fields=F.SGLANG_META_FIELDS[0][1]) -> dict:
    """meta_info of a request whose verify steps accepted ``accepted[i]`` drafts each (plus the bonus token), cut at
    max_new tokens, with the release's aliases when ``fields`` has them."""
    hist = [0] * (max(accepted) + 1)
    for a in accepted:
        hist[a] += 1
    v, c = len(accepted), sum(accepted)
    n = min(max_new, 1 + c + v)
    proposed = v * (DRAFT_TOKENS - 1)
    meta = {
        "completion_tokens": n,
        "spec_verify_ct": v,
        "spec_num_correct_drafts": c,
        "spec_num_proposed_drafts": proposed,
        "spec_accept_rate": c / proposed,
        "spec_accept_length": n / v,
        "spec_correct_drafts_histogram": hist,
    }
    for alias, original in F.ALIASES.items():
        if alias in fields:
            meta[alias] = meta[original]
    return meta


def why(meta: dict, fields=F.SGLANG_META_FIELDS[0][1]) -> list[str]:
    return F.disagreements(meta, fields=fields, draft_tokens=DRAFT_TOKENS, steps=STEPS)


WITNESS = [STEPS] * 6  # 1 + 6 * 6 = 37 tokens for 32 asked: the last step's 5 extra are cut (the tail rule's edge)
RANDOM = [0] * 30 + [1]
MIXED = [5, 0, 3, 2, 5, 1, 4]


@pytest.mark.parametrize("accepted", [WITNESS, RANDOM, MIXED], ids=["witness", "random", "mixed"])
@pytest.mark.parametrize("fields", [f for _spec, f in F.SGLANG_META_FIELDS], ids=["0.5.13-17", "0.5.18-23"])
def test_consistent_responses_agree(accepted, fields):
    assert why(response(accepted, fields=fields), fields) == []


def test_prefill_only_response_needs_no_fields():
    assert why({"completion_tokens": 1}) == []
    # every token from a prefill or a re-prefill after a retraction: no verify step either
    assert why({"completion_tokens": 32, "num_retractions": 31}) == []
    assert why({"completion_tokens": 32, "num_retractions": 30})  # one token no prefill made: a verify step ran


def test_an_abort_in_the_waiting_queue_has_no_token_and_no_fields():
    """The long family's paged server aborts its victim while queued (H100, 0.5.17, 2026-12-05f: 'completion_tokens is
    0' was flagged): sglang answers finish_reason abort, no scheduler field, completion_tokens what the client was sent
    (0, or more for a request retracted into the queue after streaming). Zero tokens for any other finish, a field on
    the abort, or an abort for lack of memory (status 500, answered by the scheduler's path) still fail."""
    aborted = {"completion_tokens": 0, "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}
    assert why(aborted) == []
    assert why({**aborted, "completion_tokens": 7}) == []  # retracted after 7 streamed tokens, then aborted queued
    assert why({**aborted, "finish_reason": {"type": "length"}}) == ["completion_tokens is 0"]
    assert why({**aborted, "spec_verify_ct": 0}) == ["spec_verify_ct on an abort answered from the waiting queue"]
    out_of_memory = {**aborted, "finish_reason": {"type": "abort", "status_code": 500, "message": "out of memory"}}
    assert why(out_of_memory) == ["completion_tokens is 0"]
    assert why({**aborted, "num_retractions": 0}) == ["completion_tokens is 0"]  # the scheduler's answer, no token


@pytest.mark.parametrize(
    "field, delta, expect",
    [
        ("spec_verify_ct", 1, "spec_accept_length 5.333333333333333 != completion_tokens/spec_verify_ct = 32/7"),
        ("spec_num_correct_drafts", 1, "histogram accepts 30 drafts, spec_num_correct_drafts 31"),
        ("spec_num_proposed_drafts", -1, "spec_num_proposed_drafts 29 != spec_verify_ct * (draft tokens - 1) = 6 * 5"),
        ("completion_tokens", -1, "spec_accept_length 5.333333333333333 != completion_tokens/spec_verify_ct = 31/6"),
        ("spec_accepted_drafts", -1, "spec_accepted_drafts 29 != spec_num_correct_drafts 30"),
    ],
)
def test_a_field_miscounted_by_one_fails_and_says_which(field, delta, expect):
    meta = response(WITNESS)
    meta[field] += delta
    assert expect in why(meta)


def test_histogram_off_by_one_in_any_bin_fails():
    for k in range(STEPS + 1):
        meta = response(MIXED)
        meta["spec_correct_drafts_histogram"] = meta["spec_correct_drafts_histogram"] + [0] * (STEPS + 1 - 6)
        meta["spec_correct_drafts_histogram"][k] += 1
        got = why(meta)
        assert f"histogram counts {len(MIXED) + 1} verify steps, spec_verify_ct {len(MIXED)}" in got, k
        assert (k == 0) or any(g.startswith("histogram accepts") for g in got), k


def test_the_bonus_counted_as_a_draft_breaks_the_tail_rule():
    """What the catalogue's metric-correct-drafts-bonus mutant does: C + V per request instead of C."""
    meta = response(WITNESS)
    meta["spec_num_correct_drafts"] += meta["spec_verify_ct"]
    got = "; ".join(why(meta))
    assert "histogram accepts 30 drafts, spec_num_correct_drafts 36" in got
    assert "accepted tokens (correct drafts + verify steps) 36 + 6 = 42 outside [31, 36]" in got


def test_tail_rule_both_ends():
    meta = response(RANDOM)  # 31 steps accepting 1 draft in all: 1 + 32 = 33 tokens, 32 kept
    assert why(meta) == []
    short = dict(
        meta,
        completion_tokens=meta["completion_tokens"] + STEPS + 1,
        spec_accept_length=(meta["completion_tokens"] + STEPS + 1) / meta["spec_verify_ct"],
    )
    assert any("outside" in w for w in why(short))  # more tokens served than the steps accepted
    long_ = response([STEPS] * 7)  # 7 steps of 6 for 31 kept tokens: one step too many
    assert any("42 outside [31, 36]" in w for w in why(long_))


def test_a_step_accepting_more_than_the_steps_is_flagged():
    meta = response([STEPS + 1, 0, 0, 0, 0, 0])
    assert any(f"more than {STEPS} drafts" in w for w in why(meta))


def test_missing_documented_field_is_named():
    meta = response(WITNESS)
    del meta["spec_accept_histogram"]
    assert why(meta) == ["missing spec_accept_histogram (completion_tokens 32)"]
    assert why(meta, F.CORE_FIELDS) == []  # 0.5.23 no longer writes the alias


def test_no_verify_count_for_many_tokens():
    assert why({"completion_tokens": 32}) == [f"missing {', '.join(F.SGLANG_META_FIELDS[0][1])} (completion_tokens 32)"]


@pytest.mark.parametrize(
    "version, aliases",
    [
        ("0.5.13", True),
        ("0.5.17", True),
        ("0.5.17.post1", True),
        ("0.5.23", False),
        ("0.5.20", False),
        ("0.6.0", False),
        ("not-a-version", False),
    ],
)
def test_documented_fields_by_release(version, aliases):
    fields = F.documented_fields(version)
    assert set(F.CORE_FIELDS) <= set(fields)
    assert (set(F.ALIASES) <= set(fields)) is aliases


def test_server_average_outside_the_requests_bounds():
    metas = [response(WITNESS) for _ in range(8)]
    assert F.server_accept_outside(metas, 6.0, STEPS) is None  # every verify accepted 6
    msg = F.server_accept_outside(metas, 3.0, STEPS)  # a server counter that doubled its steps
    assert msg.startswith("/server_info avg_spec_accept_length 3.000 outside [5.1667, 6.0]")
    assert F.server_accept_outside([{"completion_tokens": 1}], 1.0, STEPS) is None  # no verify step: no bound


def _retracted(accepted: list[int], retractions: int) -> dict:
    """meta_info of a request retracted ``retractions`` times: each re-prefill served one token no verify step
    counted (what the long servers' requests report, H200 2026-12-05: 0 + 29 for 32 tokens after 2)."""
    meta = response(accepted)
    n = meta["completion_tokens"] + retractions
    return dict(meta, completion_tokens=n, spec_accept_length=n / meta["spec_verify_ct"], num_retractions=retractions)


def test_tail_rule_counts_one_token_per_re_prefill():
    meta = _retracted([0] * 29, 2)  # 1 + 2 + 29 = 32 tokens, no draft accepted
    assert why(meta) == []
    assert any("29 outside [31, 36]" in w for w in why(dict(meta, num_retractions=0)))  # the rule before the term
    assert any("29 outside [30, 36]" in w for w in why(dict(meta, num_retractions=1)))  # one re-prefill too few
    assert any("28 outside [29, 36]" in w for w in why(dict(meta, spec_num_correct_drafts=-1)))  # a token lost
    # retracted again before a re-prefill's token was kept (0.5.17 topk 3 paged, H200: 10 + 19 for 32 tokens after
    # 34): fewer re-prefill tokens than retractions, the same upper end
    assert why(dict(_retracted([0] * 9 + [1] * 10, 0), num_retractions=34)) == []
    assert any("42 outside" in w for w in why(dict(response([STEPS] * 7), num_retractions=3)))  # still too many


def test_server_bounds_count_the_re_prefills_too():
    metas = [_retracted([STEPS] * 5, 1) for _ in range(4)]  # 1 + 1 + 30 = 32 tokens, 5 steps of 6 each
    assert F.server_accept_bounds(metas, STEPS) == (6.0, 6.0)
    assert F.server_accept_outside(metas, 6.0, STEPS) is None
    assert F.server_accept_bounds([dict(m, num_retractions=0) for m in metas], STEPS) == (6.2, 6.0)


def test_server_bounds_of_a_request_retracted_more_often_than_its_tokens():
    # the 0.5.17 topk 3 paged request (H200, 2026-12-05): 32 tokens after 34 retractions, 10 drafts over 19 steps; the
    # server's average counts its accepted tokens (29) over its steps: inside the bounds, whose top is N - 1 + S a
    # request (a retraction adds no token to the top end)
    meta = dict(_retracted([0] * 9 + [1] * 10, 0), completion_tokens=32, num_retractions=34)
    lo, hi = F.server_accept_bounds([meta], STEPS)
    assert lo <= 29 / 19 <= hi, (lo, hi)
    assert F.server_accept_outside([meta], 29 / 19, STEPS) is None
