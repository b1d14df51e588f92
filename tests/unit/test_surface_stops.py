"""The "stops" request family (mtpmatrix.tiers.surface.stops) and its smoke checks, on responses made from its own
predictions and on broken variants of them (no GPU)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.tiny.vocab import END_OF_TURN_ID, EOS_ID, VOCAB
from mtpmatrix.tiers import smoke, surface
from mtpmatrix.tiers.compat import meta_fields
from mtpmatrix.tiers.surface import stops

SPECS = {s.name: s for s in smoke_servers.SMOKE_SERVERS}
CASES = {c.label: c for c in stops.cases(VOCAB)}
TIER = Path(__file__).resolve().parents[1] / "tiers" / "test_smoke_stops.py"


def _meta(
    n: int,
    finish: dict,
    topk: int | None,
    *,
    verify: int | None = None,
    correct: int | None = None,
    hist: list[int] | None = None,
) -> dict:
    """meta_info as sglang writes it (every documented field, aliases too) for a witness request of n tokens."""
    meta = {"completion_tokens": n, "finish_reason": finish}
    pred = stops.predicted_counters(n)
    v = pred["spec_verify_ct"] if verify is None else verify
    if not topk or not v:
        return meta
    c = pred["spec_num_correct_drafts"] if correct is None else correct
    h = pred["spec_correct_drafts_histogram"] if hist is None else hist
    proposed = v * (settings.DRAFT_TOKENS[topk] - 1)
    meta.update(
        spec_verify_ct=v,
        spec_num_correct_drafts=c,
        spec_correct_drafts_histogram=h,
        spec_num_proposed_drafts=proposed,
        spec_accept_rate=c / proposed,
        spec_accept_length=n / v,
        spec_accepted_drafts=c,
        spec_proposed_drafts=proposed,
        spec_accept_histogram=h,
    )
    return meta


def _response(case: stops.Case, topk: int | None, **over) -> dict:
    """What an intact server returns for ``case`` (its first allowed finish_reason), with ``over`` replacing
    output_ids / finish_reason / text / completion_tokens / counters."""
    ids = over.pop("output_ids", case.output(VOCAB))
    finish = over.pop("finish", case.finish[0])
    text = over.pop("text", case.text if case.text is not None else "")
    n = over.pop("n", len(ids))
    return {"output_ids": ids, "text": text, "meta_info": _meta(n, finish, topk, **over)}


def _run(name: str, broken: dict | None = None) -> smoke.SmokeRun:
    """A collected run of server ``name`` whose stop family answered as predicted, except the labels in ``broken``
    (label -> response)."""
    spec = SPECS[name]
    run = smoke.SmokeRun(spec=spec, log_path=Path(f"server-{name}.log"), vocab_size=VOCAB)
    labelled = [(stops.NAME, label, payload) for label, payload in stops.requests(spec, VOCAB)]
    exchanges = []
    for _family, label, payload in labelled:
        response = (broken or {}).get(label) or _response(CASES[label], spec.topk)
        exchanges.append(surface.Exchange(label, payload, response))
    run.surface = {stops.NAME: exchanges}
    full = _meta(smoke.MAX_NEW_TOKENS, {"type": "length", "length": 32}, spec.topk)
    run.id_meta = [dict(full) for _ in range(smoke.N_ID_PROMPTS)]
    run.text_meta = [dict(full) for _ in smoke.TEXT_PROMPTS]
    run.server_info_before = {"speculative_num_draft_tokens": settings.DRAFT_TOKENS.get(spec.topk)}
    return run


def _tier():
    spec = importlib.util.spec_from_file_location("tier_test_smoke_stops", TIER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(check: str, name: str, runs: dict) -> dict:
    """Run the tier check ``check`` on server ``name``; returns what it recorded."""
    props = {}
    getattr(_tier(), check)(runs, name, lambda k, v: props.__setitem__(k, v))
    return props


def _runs(**broken) -> dict:
    """Every witness server intact, except server -> {label: response}."""
    names = ("witness-mtp-topk1", "witness-mtp-topk3", "witness-mtp-topk3-eager", "witness-nomtp")
    return {n: _run(n, broken.get(n.replace("-", "_"))) for n in names}


# --------------------------------------------------------------------------------------- the plan


def test_requests_only_for_the_witness_at_sglangs_phase():
    assert stops.requests(SPECS["decoy-mtp-topk1"], VOCAB) == []
    assert stops.requests(SPECS["witness-transformers-phase-topk1"], VOCAB) == []
    for name in ("witness-mtp-topk1", "witness-mtp-topk3", "witness-mtp-topk3-eager", "witness-nomtp"):
        reqs = stops.requests(SPECS[name], VOCAB)
        assert [label for label, _ in reqs] == list(CASES)
        for _label, payload in reqs:
            assert len(payload["input_ids"]) == smoke.PROMPT_LEN
            assert payload["sampling_params"]["ignore_eos"] is False
            assert payload["sampling_params"]["temperature"] == 0.0
            # no special, multimodal or EOS id before the last prompt token
            assert all(46 <= t < 14 + 0x7A + 1 for t in payload["input_ids"][:-1])
    assert "stops" in surface.FAMILIES


def test_stops_land_where_the_plan_says():
    """Each request's stop falls on the position its note names: the prefill token, a step's drafts, its bonus."""
    at = {label: stops.where(c.n) for label, c in CASES.items()}
    assert at["eot-prefill"] == at["stop-token-prefill"] == at["stop-str-prefill"] == "prefill"
    assert at["eos-inside"] == "step 2 draft 3" and at["stop-token-inside"] == "step 1 draft 3"
    assert at["stop-str-inside"] == "step 3 draft 3"
    assert at["eos-bonus"] == at["stop-str-bonus"] == "step 2 bonus" and at["stop-token-bonus"] == "step 1 bonus"
    assert CASES["eot-prefill"].output(VOCAB) == [END_OF_TURN_ID]
    assert CASES["eos-inside"].output(VOCAB)[-3:] == [511, 0, EOS_ID]
    assert CASES["stop-str-inside"].text == "56789:;<=>?@AB" and CASES["stop-str-bonus"].text == "?@ABCDEFGHI"
    assert CASES["stop-str-prefill"].text == ""
    # the length cut and the EOS around it fall inside step 2, the step that crosses max_new_tokens
    assert stops.where(stops.LIMIT) == "step 2 draft 3" and (stops.LIMIT - 1) % stops.STEP != 0
    assert stops.where(9) == "step 2 draft 2" and stops.where(12) == "step 2 draft 5"
    assert CASES["length-eos-before-limit"].output(VOCAB)[-1] == EOS_ID
    assert CASES["length-eos-after-limit"].output(VOCAB) == list(range(502, 512))
    # the EOS at 10 comes before '<unk>' (token 3) at 12 in the same step
    assert stops.chain(CASES["eos-before-stop-str"].last, 12, VOCAB)[-3:] == [EOS_ID, 2, 3]


def test_predicted_counters():
    assert stops.predicted_counters(1) == {
        "spec_verify_ct": 0,
        "spec_num_correct_drafts": 0,
        "spec_correct_drafts_histogram": [],
    }
    assert stops.predicted_counters(32) == {
        "spec_verify_ct": 6,
        "spec_num_correct_drafts": 30,
        "spec_correct_drafts_histogram": [0, 0, 0, 0, 0, 6],
    }
    for n in range(2, 40):  # the last step is needed and the one before it was not enough
        v = stops.verify_steps(n)
        assert 1 + stops.STEP * (v - 1) < n <= 1 + stops.STEP * v
    assert stops.verify_steps(stops.LIMIT) == math.ceil((stops.LIMIT - 1) / 6) == 2


def test_token_text_matches_the_tiny_tokenizer():
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    from mtpmatrix.pairs.tiny.vocab import make_tokenizer

    tok = make_tokenizer()
    for t in range(stops.ASCII_FIRST, stops.ASCII_LAST + 1):
        assert tok.decode([t]) == stops.token_text(t)
    for label in ("stop-str-inside", "stop-str-bonus"):
        case = CASES[label]
        assert tok.decode(case.output(VOCAB)).endswith(case.stop[0])
    assert tok.encode("<unk>", add_special_tokens=False) == [3]


# --------------------------------------------------------------------------------------- intact: every check passes


@pytest.mark.parametrize("name", ["witness-mtp-topk1", "witness-mtp-topk3", "witness-mtp-topk3-eager", "witness-nomtp"])
def test_intact_server_passes_every_check(name):
    runs = _runs()
    props = _check("test_stop_ends_the_output_exactly", name, runs)
    assert props["stop_requests_wrong"] == [] and len(props["stop_requests"]) == 10
    props = _check("test_length_cut_mid_step", name, runs)
    assert props["length_requests_wrong"] == [] and len(props["length_requests"]) == 5
    _check("test_finished_request_counters_agree", name, runs)
    if SPECS[name].topk:
        props = _check("test_witness_counters_match_prediction", name, runs)
        assert props["predicted_verify_steps"]["id[0]"] == 6


def test_eos_at_the_limit_is_either_finish_but_mtp_must_equal_no_mtp():
    stop = {"type": "stop", "matched": EOS_ID}
    case = CASES["length-eos-at-limit"]
    both = _runs(
        witness_mtp_topk1={case.label: _response(case, 1, finish=stop)},
        witness_nomtp={case.label: _response(case, None, finish=stop)},
    )
    _check("test_length_cut_mid_step", "witness-mtp-topk1", both)  # 0.5.23's convention, on both servers
    only_mtp = _runs(witness_mtp_topk1={case.label: _response(case, 1, finish=stop)})
    with pytest.raises(CheckFailure, match="MTP finish_reason .* != no-MTP"):
        _check("test_length_cut_mid_step", "witness-mtp-topk1", only_mtp)


# --------------------------------------------------------------------------------------- broken: each check fails


def _fails(check: str, name: str, runs: dict, kind: str, match: str) -> CheckFailure:
    with pytest.raises(CheckFailure, match=match) as info:
        _check(check, name, runs)
    assert info.value.kind == kind
    return info.value


def test_tokens_kept_after_an_eos_inside_a_run_fail():
    case = CASES["eos-inside"]
    kept = stops.chain(case.last, 13, VOCAB)  # the rest of step 2 after the EOS
    err = _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk3",
        _runs(witness_mtp_topk3={case.label: _response(case, 3, output_ids=kept)}),
        "mismatch",
        r"eos-inside .*output_ids .*len 13.* != predicted .*len 10.*first difference at position 11",
    )
    assert "MTP output_ids" in str(err)


def test_generation_config_eos_ignored_fails():
    case = CASES["eot-prefill"]
    ran_on = _response(case, 1, output_ids=stops.chain(case.last, 32, VOCAB), finish={"type": "length", "length": 32})
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk1",
        _runs(witness_mtp_topk1={case.label: ran_on}),
        "mismatch",
        "eot-prefill",
    )


def test_stop_token_on_the_bonus_dropped_fails():
    case = CASES["stop-token-bonus"]
    short = _response(case, 1, output_ids=case.output(VOCAB)[:-1])
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk1",
        _runs(witness_mtp_topk1={case.label: short}),
        "mismatch",
        r"stop-token-bonus .*first difference at position 7 \(step 1 bonus\)",
    )


def test_stop_string_left_in_the_text_fails():
    case = CASES["stop-str-inside"]
    untrimmed = _response(case, 3, text=case.text + "CD")
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk3",
        _runs(witness_mtp_topk3={case.label: untrimmed}),
        "mismatch",
        r"text '56789:;<=>\?@ABCD' != predicted",
    )


def test_stop_string_beating_an_earlier_eos_fails():
    """0.5.17/0.5.23 spec-v2: the stop string (position 12) is checked before the EOS (10) of the same step."""
    case = CASES["eos-before-stop-str"]
    late = _response(case, 1, output_ids=stops.chain(case.last, 12, VOCAB), finish={"type": "stop", "matched": "<unk>"})
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk1",
        _runs(witness_mtp_topk1={case.label: late}),
        "mismatch",
        r"eos-before-stop-str .*finish_reason .*<unk>.* != predicted .*'matched': 1",
    )


def test_length_checked_before_an_eos_in_the_crossing_step_fails():
    """0.5.17 spec-v2: max_new_tokens is checked first, so the EOS at 9 stays and position 10 follows it."""
    case = CASES["length-eos-before-limit"]
    over = _response(
        case, 3, output_ids=stops.chain(case.last, stops.LIMIT, VOCAB), finish={"type": "length", "length": stops.LIMIT}
    )
    _fails(
        "test_length_cut_mid_step",
        "witness-mtp-topk3",
        _runs(witness_mtp_topk3={case.label: over}),
        "mismatch",
        r"length-eos-before-limit .*first difference at position 10",
    )


def test_length_overshoot_fails():
    case = CASES["length-mid-step"]
    over = _response(case, 1, output_ids=stops.chain(case.last, 13, VOCAB))  # the whole crossing step kept
    _fails(
        "test_length_cut_mid_step",
        "witness-mtp-topk1",
        _runs(witness_mtp_topk1={case.label: over}),
        "mismatch",
        "length-mid-step",
    )
    _fails(
        "test_finished_request_counters_agree",
        "witness-mtp-topk1",
        _runs(witness_mtp_topk1={case.label: over}),
        "accounting",
        "beyond max_new_tokens|with completion_tokens 13",
    )


def test_mtp_differing_from_no_mtp_fails_even_when_the_reference_is_wrong():
    case = CASES["stop-token-inside"]
    wrong_ref = _response(case, None, output_ids=stops.chain(case.last, 5, VOCAB))
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-mtp-topk1",
        _runs(witness_nomtp={case.label: wrong_ref}),
        "mismatch",
        "MTP output_ids .* != no-MTP",
    )
    _fails(
        "test_stop_ends_the_output_exactly",
        "witness-nomtp",
        _runs(witness_nomtp={case.label: wrong_ref}),
        "mismatch",
        "stop-token-inside",
    )


def test_failed_request_fails():
    runs = _runs()
    xs = runs["witness-mtp-topk3"].surface[stops.NAME]
    xs[0] = surface.Exchange(xs[0].label, xs[0].payload, {}, "HTTP 400: stop_token_ids refused")
    _fails("test_stop_ends_the_output_exactly", "witness-mtp-topk3", runs, "mismatch", "request failed: HTTP 400")


@pytest.mark.parametrize(
    "label,over,match",
    [
        ("eos-inside", {"n": 11}, r"completion_tokens 11 != len\(output_ids\) 10"),
        ("length-mid-step", {"finish": {"type": "length", "length": 32}}, "with completion_tokens 10"),
        ("stop-token-inside", {"finish": {"type": "stop", "matched": 160}}, "but output_ids end"),
        ("stop-str-bonus", {"finish": {"type": "stop", "matched": "XY"}}, "matched no requested stop string"),
        ("eos-bonus", {"finish": None}, "neither a stop nor a length finish"),
        # a verify step counted after the request finished (an overlap step not skipped)
        ("eos-inside", {"verify": 3, "hist": [0, 0, 0, 0, 0, 3], "correct": 15}, r"outside \[9, 14\]"),
        # the counters cut to what the output kept, the histogram not
        ("stop-token-inside", {"correct": 2}, "histogram accepts 5 drafts, spec_num_correct_drafts 2"),
    ],
)
def test_self_contradicting_counters_fail(label, over, match):
    case = CASES[label]
    runs = _runs(witness_mtp_topk3={label: _response(case, 3, **over)})
    err = _fails("test_finished_request_counters_agree", "witness-mtp-topk3", runs, "accounting", match)
    assert label in str(err)


@pytest.mark.parametrize(
    "label,over,match",
    [
        ("eot-prefill", {"verify": 1, "correct": 5, "hist": [0, 0, 0, 0, 0, 1]}, "spec_verify_ct 1 != predicted 0"),
        ("eos-inside", {"correct": 8, "hist": [0, 0, 0, 3, 0, 1]}, "spec_num_correct_drafts 8 != predicted 10"),
        ("stop-str-bonus", {"hist": [0, 0, 0, 0, 1, 1], "correct": 9}, r"histogram \[0, 0, 0, 0, 1, 1\]"),
        (
            "length-mid-step",
            {"verify": 3, "correct": 15, "hist": [0, 0, 0, 0, 0, 3]},
            "spec_verify_ct 3 != predicted 2",
        ),
    ],
)
def test_counters_off_the_prediction_fail(label, over, match):
    case = CASES[label]
    runs = _runs(witness_mtp_topk1={label: _response(case, 1, **over)})
    _fails("test_witness_counters_match_prediction", "witness-mtp-topk1", runs, "acceptance", f"{label}: .*{match}")


def test_a_lost_draft_on_a_greedy_request_fails():
    runs = _runs()
    runs["witness-mtp-topk3"].id_meta[2] = _meta(
        32, {"type": "length", "length": 32}, 3, verify=7, correct=29, hist=[0, 0, 0, 0, 1, 6]
    )
    _fails(
        "test_witness_counters_match_prediction",
        "witness-mtp-topk3",
        runs,
        "acceptance",
        r"1/\d+ requests .*id\[2\]: spec_verify_ct 7 != predicted 6",
    )


def test_intact_meta_agrees_with_meta_fields():
    """The fake responses above are what meta_fields calls consistent (so the broken ones fail for their break)."""
    for case in CASES.values():
        meta = _meta(case.n, case.finish[0], 3)
        assert (
            meta_fields.disagreements(
                meta,
                fields=meta_fields.CORE_FIELDS + tuple(meta_fields.ALIASES),
                draft_tokens=settings.DRAFT_TOKENS[3],
                steps=settings.NUM_STEPS,
            )
            == []
        )
    assert CASES["eos-inside"].finish == ({"type": "stop", "matched": EOS_ID},)
