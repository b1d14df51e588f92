"""The request shapes of issue #38 item 3 end to end against the fake sglang (fake_shapes.WitnessShapes): each
family's requests go through the client (streamed events, OpenAI endpoints, list answers) into exchanges, and each
family's checks pass on the intact fake and fail on a fake broken the way that check exists to catch."""

from __future__ import annotations

import pytest
from fake_sglang import FakeSglang
from fake_shapes import PREDICTED_ROWS, WitnessShapes, hidden_row

from mtpmatrix.core import smoke_servers
from mtpmatrix.serving import client
from mtpmatrix.tiers import smoke, surface
from mtpmatrix.tiers.surface import hidden_states, parallel_n, stop_regex, streaming, structured, token_ids_logprob

WITNESS = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk3")
NOMTP = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-nomtp")


def collect(family, broken: str = "", spec=WITNESS, drop_done: bool = False) -> list[surface.Exchange]:
    """The family's requests for ``spec`` through client.run_batch against a fake, as the smoke tier collates them."""
    labelled = [(family.NAME, label, payload) for label, payload in family.requests(spec, 512)]
    shapes = WitnessShapes(broken)
    shapes.drop_done = drop_done
    with FakeSglang(shapes=shapes) as fake:
        results = client.run_batch(fake.base_url, [p for _f, _l, p in labelled], parallel=4)
    return surface.collate(labelled, results)[family.NAME]


def test_every_new_family_is_listed_and_applies_to_the_witness_servers():
    for family in (structured, hidden_states, stop_regex, token_ids_logprob, streaming, parallel_n):
        assert family.NAME in surface.FAMILIES
        assert family.requests(WITNESS, 512) and family.requests(NOMTP, 512)
    eager = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk3-eager")
    assert not hidden_states.requests(eager, 512)  # no --enable-return-hidden-states there: sglang would refuse


def test_structured_intact_then_grammar_violation():
    ok = collect(structured)
    assert structured.own_problems(ok, 512) == []
    assert structured.against_reference(ok, collect(structured, spec=NOMTP)) == []
    bad = structured.own_problems(collect(structured, "grammar"), 512)
    assert bad and "not valid under its regex" in bad[0]


def test_structured_fold_makes_byte_twins_equal_and_nothing_else():
    a = structured.ASCII_FIRST + ord("5") - 32
    assert structured.fold(structured.BYTE_FIRST + ord("5")) == a
    assert structured.fold(a) == a and structured.fold(structured.BYTE_FIRST + ord("6")) != a


def test_hidden_states_intact_then_extra_and_wrong_rows():
    ok = collect(hidden_states)
    assert [p for x in ok for p in hidden_states.count_problems(x)] == []
    assert hidden_states.prediction_problems(ok, PREDICTED_ROWS) == []
    assert hidden_states.against_reference(ok, collect(hidden_states, spec=NOMTP)) == []
    extra = collect(hidden_states, "hidden-extra-row")
    assert any("32 decode rows for 32 output tokens" in p for x in extra for p in hidden_states.count_problems(x))
    wrong = collect(hidden_states, "hidden-wrong-row")  # each decode row the next node's
    assert hidden_states.prediction_problems(wrong, PREDICTED_ROWS) == [
        "hidden-30 output 1..30 (inputs 42..71): the rows of inputs 43..72 (+1)",
        "hidden-50 output 1..31 (inputs 62..92): the rows of inputs 63..93 (+1)",
        "hidden-145 output 1..31 (inputs 157..187): the rows of inputs 158..188 (+1)",
    ]
    assert hidden_states.against_reference(wrong, ok)


def test_hidden_rows_of_another_request_or_of_no_token_fail_even_where_no_other_row_shares_their_input():
    """An asking request's prefill block holding a plain request's prompt rows (0.5.13's prefill offset, predicted
    from its source), on the no-MTP server where no other request reads the same input tokens, and a row of no
    token at all: each named by whose row it is."""
    ok = collect(hidden_states, spec=NOMTP)
    by = {x.label: x for x in ok}
    plain = by["plain-85"].payload["input_ids"]
    moved = [hidden_row(x) for x in plain]
    asking = by["hidden-145"]
    block = [moved, *asking.meta["hidden_states"][1:]]
    block[3] = [0.0] * hidden_states.HIDDEN
    bad = surface.Exchange(
        asking.label, asking.payload, {**asking.response, "meta_info": {**asking.meta, "hidden_states": block}}
    )
    assert [p for p in hidden_states.count_problems(bad)] == []  # the shape is right ...
    assert hidden_states.prediction_problems([bad], PREDICTED_ROWS) == [  # ... the rows are not
        "hidden-145 prompt 0..11 (inputs 145..156): the rows of inputs 85..96 (-60)",
        "hidden-145 output 3 (input 159): the row of no input token (element 0 0, predicted 20.875)",
    ]


def first_tokens(spec) -> list[tuple[str, int]]:
    """(label, first prompt token) of every token-id request the smoke tier sends server ``spec``: its own greedy
    prompts and every family's."""
    own = [("smoke", p[0]) for p in smoke.id_prompts(512)]
    for _family, label, payload in surface.requests_for(spec, 512):
        body = getattr(payload, "body", payload)
        ids = body.get("input_ids") if isinstance(body, dict) else None
        ids = ids if ids is not None else (body.get("prompt") if isinstance(body, dict) else None)
        if isinstance(ids, list) and ids and isinstance(ids[0], int):
            own.append((label, ids[0]))
    return own


def test_no_hidden_states_prompt_shares_a_prefix_with_another_request():
    """sglang returns the prefill rows it computed: a prompt another request prefilled first (a radix hit, even of
    one token) would get a short block on intact sglang. So each asking prompt's first token is its own."""
    for spec in (s for s in smoke_servers.SMOKE_SERVERS if hidden_states.requests(s, 512)):
        starts = first_tokens(spec)
        for label, payload in hidden_states.requests(spec, 512):
            if payload.get("return_hidden_states"):
                others = [other for other, t in starts if t == payload["input_ids"][0] and other != label]
                assert not others, f"{spec.name}: {label}'s prompt starts like {others}'"


def collect_all_in_order(spec=WITNESS) -> dict[str, list[surface.Exchange]]:
    """Every family's requests for ``spec``, one at a time in the tier's order: each prompt sees the radix cache of
    every earlier one (the fake caches prompts as sglang does, fake_shapes.cached_prefix)."""
    labelled = surface.requests_for(spec, 512)
    with FakeSglang(shapes=WitnessShapes()) as fake:
        results = client.run_batch(fake.base_url, [p for _f, _l, p in labelled], parallel=1)
    return surface.collate(labelled, results)


def test_hidden_states_blocks_whole_behind_every_other_request_then_short_on_a_shared_prompt(monkeypatch):
    ok = collect_all_in_order()["hidden_states"]
    assert [p for x in ok for p in hidden_states.count_problems(x)] == []
    assert all(x.meta["cached_tokens"] == 0 for x in ok if x.payload.get("return_hidden_states"))
    # the start 140 this family asked with until 2026-12-05: features' min-new-tokens request sends that prompt first
    monkeypatch.setattr(hidden_states, "ASKING", (30, 50, 140))
    hit = collect_all_in_order()["hidden_states"]
    problems = [p for x in hit for p in hidden_states.count_problems(x)]
    assert problems == [
        "hidden-140: prefill block of 1 rows for 12 prompt tokens (cached_tokens 11: a radix hit "
        "leaves only the rows sglang computed)"
    ]


def test_hidden_states_tolerance_is_two_bf16_ulps():
    x = [1.0, -3.0, 0.0]
    assert hidden_states.row_difference(x, [1.0 + 2 * 2**-7 - 1e-9, -3.0, 0.0]) is None
    assert hidden_states.row_difference(x, [1.0 + 3 * 2**-7, -3.0, 0.0]) is not None
    assert hidden_states.row_difference(x, [1.0, -3.0, 1e-3]) is not None  # a zero element stays zero


def test_stop_regex_intact_then_late():
    def problems(exchanges):
        by = {c.label: c for c in stop_regex.CASES}
        return [p for x in exchanges for p in stop_regex.problems(by[x.label], x, 512)]

    ok = collect(stop_regex)
    assert problems(ok) == []
    late = problems(collect(stop_regex, "stop-regex-late"))
    assert len(late) == len(stop_regex.CASES) and "predicted 16" in late[0]
    assert stop_regex.against_reference(collect(stop_regex, "stop-regex-late"), ok)


def test_token_ids_logprob_intact_then_a_position_late():
    ok = collect(token_ids_logprob)
    assert [p for x in ok for p in token_ids_logprob.own_problems(x)] == []
    late = [p for x in collect(token_ids_logprob, "ids-logprob") for p in token_ids_logprob.own_problems(x)]
    assert late and "has logprob" in late[0]
    assert token_ids_logprob.against_reference(collect(token_ids_logprob, "ids-logprob"), ok)


def test_streaming_reassembles_then_a_gap_and_a_usage_miscount():
    ok = collect(streaming)
    assert [len(streaming.events(x)) for x in ok if x.label.startswith("stream-")] == [7, 7]  # 1 + 5 steps + tail
    assert streaming.own_problems(ok, release_has_spec_details=True) == []
    assert streaming.against_reference(ok, collect(streaming, spec=NOMTP)) == []
    gap = streaming.own_problems(collect(streaming, "stream-gap"), release_has_spec_details=True)
    assert gap and "the last event's output_ids (31) != the plain answer's (32)" in gap[0]
    usage = streaming.own_problems(collect(streaming, "usage"), release_has_spec_details=True)
    assert usage and "usage.completion_tokens 31" in usage[0]


def test_streaming_fails_on_empty_answers():
    """Empty /generate and /v1/completions answers (plain, streamed, usage 0) agree with each other and with an empty
    no-MTP server: only holding the plain answer to the chain sees them."""
    empty = collect(streaming, "plain-empty")
    problems = streaming.own_problems(empty, release_has_spec_details=False)
    assert problems[0].startswith(f"plain-{streaming.LASTS[0]}: output_ids []... (0, completion_tokens 0) are not")
    assert len(problems) == 2 * len(streaming.LASTS)  # ids and text of each plain answer; nothing else differs
    assert streaming.against_reference(empty, collect(streaming, "plain-empty", spec=NOMTP)) == []


def test_openai_spec_details_where_the_release_has_them():
    ok = collect(streaming)
    assert streaming.has_spec_details("0.5.23") and not streaming.has_spec_details("0.5.17")
    assert streaming.spec_details(next(x for x in ok if x.label.startswith("completions-stream-")))
    assert streaming.own_problems(ok, release_has_spec_details=True) == []
    bad = collect(streaming, "spec-details")
    assert streaming.own_problems(bad, release_has_spec_details=False) == []  # 0.5.13 / 0.5.17: nothing to hold
    problems = streaming.own_problems(bad, release_has_spec_details=True)
    assert problems and "spec_tokens_details against /generate's: spec_verify_ct 7 != 6" in problems[0]


def test_a_stream_without_done_is_an_error_not_an_answer():
    exchanges = collect(streaming, drop_done=True)
    streamed = [
        x for x in exchanges if x.label.endswith("stream") or "-stream-" in x.label or x.label.startswith("stream-")
    ]
    assert streamed and all("without data: [DONE]" in (x.error or "") for x in streamed)
    with pytest.raises(Exception, match="requests failed"):
        surface.answered(type("Run", (), {"exchanges": lambda self, f: exchanges})(), "streaming", len(exchanges))


def test_parallel_n_intact_then_a_sample_short():
    ok = collect(parallel_n)
    assert [len(parallel_n.samples(x)) for x in ok] == [2, 3]
    assert [p for x in ok for p in parallel_n.own_problems(x, 512)] == []
    assert sum(len(x.metas) for x in ok) == 5  # every sample's meta_info counts (SmokeRun.all_meta)
    short = [p for x in collect(parallel_n, "n-short") for p in parallel_n.own_problems(x, 512)]
    assert short == ["n2-70: 1 samples for n=2", "n3-180: 2 samples for n=3"]
    copied = [p for x in collect(parallel_n, "n-one-sample") for p in parallel_n.own_problems(x, 512)]
    assert copied == [
        "n2-70: sample ids ['0', '0']: not 2 requests of their own (one answer copied?)",
        "n3-180: sample ids ['0', '0', '0']: not 3 requests of their own (one answer copied?)",
    ]


# ---------------------------------------------------------------------------------------------- the catalogue's mutants
# Each request-shape mutant of mtpmatrix.faults.catalogue.request_surface, as the answers it makes sglang give (the fake
# broken the same way, fake_shapes): the check its ``expect`` names fails, on the MTP server's answers and against the
# intact no-MTP reference.
def test_grammar_verify_unmasked_fails_the_structured_checks():
    bad = collect(structured, "grammar-unmasked")
    problems = structured.own_problems(bad, 512)
    assert any(p.startswith("regex: output 'abcdefgh'") and "not valid under its regex" in p for p in problems)
    assert any(p.startswith("ebnf: output 'abcdefg'") for p in problems)
    assert any("finish_reason {'type': 'abort'" in p for p in problems)
    assert not [p for p in problems if p.startswith("neighbour-")]  # the unconstrained neighbours stay right
    assert structured.against_reference(bad, collect(structured, spec=NOMTP))


def test_stop_regex_at_step_end_fails_the_stop_regex_checks():
    by = {c.label: c for c in stop_regex.CASES}
    bad = collect(stop_regex, "stop-regex-step-end")
    problems = [p for x in bad for p in stop_regex.problems(by[x.label], x, 512)]
    assert any("regex-inside" in p and "predicted 16" in p for p in problems), problems
    # a match on a step's last token (the bonus at 13, the prefill token at 1) is where the mutant ends anyway
    assert not [p for p in problems if p.startswith(("regex-bonus", "regex-prefill"))]
    assert stop_regex.against_reference(bad, collect(stop_regex, spec=NOMTP))


def test_ids_logprob_node_early_fails_the_token_ids_logprob_checks():
    bad = collect(token_ids_logprob, "ids-logprob-early")
    problems = [p for x in bad for p in token_ids_logprob.own_problems(x)]
    assert problems and all("has logprob" in p for p in problems)
    assert token_ids_logprob.against_reference(bad, collect(token_ids_logprob, spec=NOMTP))


def test_stream_run_last_token_only_fails_the_streaming_checks():
    bad = collect(streaming, "stream-last-only")
    problems = streaming.own_problems(bad, release_has_spec_details=True)
    assert (
        problems and "the last event's output_ids (7) != the plain answer's (32)" in problems[0]
    )  # 1 + 5 steps + tail
    assert streaming.against_reference(bad, collect(streaming, spec=NOMTP))


def test_the_mixed_batchs_top_logprob_request_is_held_like_the_logprobs_family():
    """top-350 beside the asking requests: its top logprobs missing, or cut short, fail."""
    top = next(x for x in collect(token_ids_logprob) if x.label == "top-350")
    bare = surface.Exchange(top.label, top.payload, {**top.response, "meta_info": {}})
    assert "0 output_token_logprobs and 0 output_top_logprobs" in token_ids_logprob.own_problems(bare)[0]
    short = {**top.meta, "output_top_logprobs": [r[:1] for r in top.meta["output_top_logprobs"]]}
    cut = surface.Exchange(top.label, top.payload, {**top.response, "meta_info": short})
    assert "1 top logprobs, 3 asked" in token_ids_logprob.own_problems(cut)[0]


def test_a_stop_token_inside_a_grammar_or_a_finish_naming_another_id_fails():
    """A grammar's text with an EOS inside (the stop id used to decode to nothing) and a finish_reason whose matched
    id is not the output's last."""
    case = structured.CASES[0]
    ok = next(x for x in collect(structured) if x.label == case.label)
    assert structured.case_problems(case, ok) == []
    ids = ok.output_ids
    inside = ids[:3] + [structured.EOS_ID] + ids[3:]
    bad = surface.Exchange(case.label, ok.payload, {**ok.response, "output_ids": inside})
    assert "is not valid under its" in structured.case_problems(case, bad)[0]
    wrong = {**ok.meta, "finish_reason": {"type": "stop", "matched": "anything"}}
    bad = surface.Exchange(case.label, ok.payload, {**ok.response, "meta_info": wrong})
    assert "expected a stop matching the last id" in structured.case_problems(case, bad)[0]


@pytest.mark.parametrize("family", [structured, stop_regex, token_ids_logprob, streaming, parallel_n])
def test_a_comparison_with_no_mtp_never_passes_having_compared_nothing(family):
    """Every no-MTP request failed: each MTP-equals-no-MTP check names every request it could not compare."""
    mine = collect(family)
    failed = [surface.Exchange(x.label, x.payload, {}, "ConnectionError: refused") for x in collect(family, spec=NOMTP)]
    problems = family.against_reference(mine, failed)
    gaps = [p for p in problems if "the no-MTP reference has no answer" in p]
    assert len(gaps) == len([x for x in mine if not x.error]) > 0
    assert family.against_reference(mine, failed[1:] and collect(family, spec=NOMTP)) == []
