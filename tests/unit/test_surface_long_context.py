"""The long-and-tight family (issue #38 item 2) end to end against the fake sglang (fake_long.LongWitnessShapes):
its requests go through the client as the smoke tier sends them (one batch, then the ALONE ones one at a time; the
abort streamed, the abort sent mid-batch), and its checks pass on the intact fake and fail on a fake broken the way
each check exists to catch."""

from __future__ import annotations

import pytest
from fake_long import LongWitnessShapes
from fake_sglang import FakeSglang
from long_runs import MTP_NAMES, NOMTP, SPECS, TOPK3, collect, fake_runs, tier_module

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs import long_witness
from mtpmatrix.serving import abort
from mtpmatrix.tiers import surface
from mtpmatrix.tiers.surface import long_context


def test_the_family_serves_the_long_servers_only():
    assert long_context.NAME in surface.FAMILIES
    assert set(smoke_servers.LONG_SERVERS) == set(SPECS) and all(s.default for s in SPECS.values())
    for spec in smoke_servers.SMOKE_SERVERS:  # LONG_SERVERS: the default ones; the on-demand ones get it too
        assert bool(long_context.requests(spec, 512)) == (spec.pair == long_context.PAIR)
        assert (spec.name in smoke_servers.LONG_SERVERS) == (spec.pair == long_context.PAIR and spec.default)
    assert smoke_servers.page_size(TOPK3) == 16 and smoke_servers.page_size(NOMTP) == 1


def test_lengths_follow_sglangs_reservation_and_clamp():
    # no MTP: the scheduler's clamp, prompt + output = context_len - 2; MTP: the tokenizer reserves max(topk x 5, draft)
    assert [long_context.reserved(k) for k in (None, 1, 3)] == [0, 6, 15]
    assert [long_context.PROMPT + long_context.limit_new(k, long_context.PROMPT) for k in (None, 1, 3)] == [
        254,
        250,
        241,
    ]
    assert long_context.cached_bounds(100, 16) == (96, 100) and long_context.cached_bounds(100, 1) == (100, 100)
    # MTP: the radix keys are token pairs, the 100th shared token's pair differs from the first tail token on
    assert long_context.cached_bounds(100, 1, mtp=True) == (99, 99)
    assert long_context.cached_bounds(100, 16, mtp=True) == (96, 99)


def test_prompts_cross_the_window_and_chunks_and_share_a_long_prefix():
    payloads = dict(long_context.requests(NOMTP, 512))
    limit = payloads["limit-0"]["input_ids"]
    assert len(limit) > 2 * long_context.WINDOW and len(limit) > 4 * smoke_servers.LONG_CHUNK
    first, repeat = payloads["prefix-first"]["input_ids"], payloads["prefix-repeat"]["input_ids"]
    assert first[: long_context.SHARED] == repeat[: long_context.SHARED] and long_context.SHARED > long_context.WINDOW
    assert first[long_context.SHARED] != repeat[long_context.SHARED]
    # every prompt holds one key: the rule predicts it
    assert long_witness.expected_continuation(repeat, len(repeat) + 4, long_context.WINDOW)
    assert isinstance(payloads["abort"], abort.AbortMidBatch) and payloads["abort"].victim["rid"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_intact_fake_passes(name):
    spec = SPECS[name]
    got = collect(spec)
    assert long_context.own_problems(spec, got) == []
    ab = next(x for x in got if x.label == "abort")
    assert ab.response["aborted_mid_batch"], ab.response["abort_note"]
    assert long_context.against_reference(got, collect(NOMTP)) == []


def test_the_pool_runs_two_of_the_abort_group_at_once():
    # sglang's admission (fake_long: PrefillAdder.add_one_req) lets two 160-token requests to the limit run on the
    # 640-token pool, not three: the group is a neighbour and its victim, aborted while both decode
    item = dict(long_context.requests(NOMTP, 512))["abort"]
    assert len(item.neighbours) == long_context.N_NEIGHBOURS == 1
    with FakeSglang(shapes=LongWitnessShapes(None)) as fake:
        got = abort.run(fake.base_url, item)
    assert got["aborted_mid_batch"] and got["abort_note"] == "tokens streamed when the abort was sent: [1, 1]"


@pytest.mark.parametrize("name", MTP_NAMES)
def test_a_victim_aborted_in_the_waiting_queue_passes(name):
    # the 16-page topk 3 server under the spec-v2 worker retracts the later of the two at its first decode, so the
    # abort finds the victim queued: sglang answers the stream with its last token only and no counters
    spec = SPECS[name]
    got = collect(spec, queued_victim=True)
    ab = next(x for x in got if x.label == "abort")
    victim = ab.response["outputs"][-1]
    assert long_context.own_problems(spec, got) == []
    assert (
        victim["output_ids_from_stream"] and len(victim["output_ids"]) == victim["meta_info"]["completion_tokens"] == 2
    )
    assert [label for label, _m in long_context.accept_metas(got)][-1] == "abort neighbour 0"
    # the answer as sglang sends it, not rebuilt from the stream: its one token is the victim's second, not its first
    raw = {**victim, "output_ids": victim["output_ids"][-1:]}
    sent = surface.Exchange("abort", ab.payload, {**ab.response, "outputs": [*ab.response["outputs"][:-1], raw]})
    assert long_context.abort_problems(sent, long_context.limit_new(spec.topk, long_context.PROMPT), spec.topk) == [
        "abort victim: its 1 tokens leave the rule"
    ]
    # a victim the scheduler finished carries num_retractions; the acceptance check still holds it
    ran = [(label, m) for label, m in long_context.accept_metas(collect(spec)) if label == "abort victim"]
    assert ran and "num_retractions" in ran[0][1]


def test_no_radix_hit_fails():
    bad = long_context.own_problems(TOPK3, collect(TOPK3, "cached-zero"))
    assert bad == [
        "prefix-repeat: cached_tokens 0, the 100-token shared prefix in 16-token pages gives [96, 99] (radix hit)"
    ]


def test_mtp_repeat_matches_the_shared_prefix_but_its_last_token():
    topk1 = SPECS["long-witness-mtp-topk1"]
    repeat = next(x for x in collect(topk1) if x.label == "prefix-repeat")
    assert repeat.meta["cached_tokens"] == 99 and long_context.cache_problems(topk1, repeat) == []
    # the no-MTP twin's bound on the MTP server's answer: 99 is outside it (the bound this replaces)
    assert long_context.cache_problems(NOMTP, repeat) == [
        "prefix-repeat: cached_tokens 99, the 100-token shared prefix in 1-token pages gives [100, 100] (radix hit)"
    ]


def test_one_token_short_fails():
    bad = long_context.own_problems(NOMTP, collect(NOMTP, "one-short"))
    assert any(p.startswith("limit-0: 93 output ids") for p in bad)
    assert any(p.startswith("abort neighbour 0: 93 output ids") for p in bad)


def test_a_changed_neighbour_fails_and_differs_from_no_mtp():
    spec = SPECS["long-witness-mtp-topk1"]
    got = collect(spec, "neighbour-changed")
    bad = long_context.own_problems(spec, got)
    assert len([p for p in bad if p.startswith("abort neighbour")]) == long_context.N_NEIGHBOURS
    assert all("token 1 is" in p for p in bad)
    assert long_context.against_reference(got, collect(NOMTP))


def test_an_ignored_abort_fails():
    bad = long_context.own_problems(TOPK3, collect(TOPK3, "abort-ignored"))
    assert any("finish_reason {'type': 'length'" in p and p.startswith("abort victim") for p in bad)
    assert any("the abort did not stop it" in p for p in bad)


def test_an_answered_over_limit_request_fails():
    bad = long_context.own_problems(NOMTP, collect(NOMTP, "over-limit-taken"))
    assert bad and bad[0].startswith("over-limit: asked 97 new tokens, answered")


def test_a_victim_the_pool_keeps_queued_is_aborted_there():
    # the topk 3 paged server on 0.5.17 never admitted the victim beside its neighbour: the abort waited for a token
    # the victim never streamed, and the check tested nothing ("a request finished first: [81, 0]"); the abort now goes
    # out once the neighbour is past its first decode step, to the victim in the queue
    item = dict(long_context.requests(TOPK3, 512))["abort"]
    shapes = LongWitnessShapes(TOPK3.topk, smoke_servers.page_size(TOPK3), victim_waits=True)
    with FakeSglang(shapes=shapes) as fake:
        got = abort.run(fake.base_url, item)
    assert got["aborted_mid_batch"] and got["abort_note"].endswith(", 0]"), got["abort_note"]
    victim = got["outputs"][-1]
    assert victim["meta_info"]["finish_reason"]["type"] == "abort" and victim["output_ids"] == []
    x = surface.Exchange("abort", item, got)
    want = long_context.limit_new(TOPK3.topk, long_context.PROMPT)
    assert long_context.abort_problems(x, want, TOPK3.topk, smoke_servers.page_size(TOPK3)) == []
    # the same on an unpaged server, where the victim decodes beside its neighbours on every measured run: the abort
    # of a running request was not tested (the review's case, 2026-12-05c: it used to pass)
    assert long_context.abort_problems(x, want, TOPK3.topk, 1)[0].startswith("abort: the victim had decoded nothing")


def test_only_the_victims_aborted_answer_is_rebuilt_from_its_stream():
    """A short final answer is rebuilt from the stream only for the victim aborted in the queue; a neighbour that
    finished by length with only its last token in the answer keeps it (the review's case, 2026-12-05c)."""
    streamed = [5, 6, 7]
    short = {"output_ids": [7], "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "length"}}}
    assert abort._whole(short, streamed) == short
    aborted = {**short, "meta_info": {**short["meta_info"], "finish_reason": {"type": "abort"}}}
    assert abort._whole(aborted, streamed)["output_ids"] == streamed


def test_an_abort_not_sent_mid_batch_tests_nothing():
    item = dict(long_context.requests(NOMTP, 512))["abort"]
    lone = abort.AbortMidBatch(
        (), {**item.victim, "sampling_params": {**item.victim["sampling_params"], "max_new_tokens": 1}}
    )
    with FakeSglang(shapes=LongWitnessShapes(None)) as fake:
        got = abort.run(fake.base_url, lone)
    assert not got["aborted_mid_batch"] and "finished first" in got["abort_note"]
    x = surface.Exchange("abort", item, got)
    assert long_context.abort_problems(x, 94, None)[0].startswith("abort: the abort was not sent mid-batch")


# ------------------------------------------------------------------------------------------- each request's acceptance
MTP = [n for n, s in SPECS.items() if s.topk]


def test_predicted_counters_are_every_draft_accepted():
    # the limit requests: 90 tokens at topk 1 (89 after the prefill one, 15 steps of 6), 81 at topk 3 (14 steps)
    assert long_context.predicted_counters(90, 0)["spec_verify_ct"] == 15
    assert long_context.predicted_counters(81, 0) == {
        "completion_tokens": 81,
        "spec_verify_ct": 14,
        "accept_length": 5.7857,
        "spec_num_correct_drafts": 70,
        "spec_correct_drafts_histogram": [0, 0, 0, 0, 0, 14],
    }
    # the prefix pair (32 tokens): 6 steps; a retraction's re-prefill yields the 32nd without one
    assert long_context.predicted_counters(32, 0)["spec_verify_ct"] == 6
    assert long_context.predicted_counters(32, 1)["spec_verify_ct"] == 5
    assert long_context.predicted_counters(1, 0)["spec_verify_ct"] == 0  # done at prefill
    # no MTP: nothing to hold
    assert long_context.accept_problems(NOMTP, collect(NOMTP)) == []


@pytest.mark.parametrize("name", MTP)
def test_intact_acceptance_holds_with_retractions(name):
    spec = SPECS[name]
    got = collect(spec, retract_after=2)
    assert all(m["num_retractions"] == 1 for _l, m in long_context.accept_metas(got) if m["completion_tokens"] > 14)
    assert long_context.own_problems(spec, got) == []
    # the retraction term is what keeps it exact: the prefix pair (32 tokens) took 5 verify steps, not 6, so the check
    # fed the same answers with num_retractions 0 fails on them
    blind = [
        surface.Exchange(x.label, x.payload, {**x.response, "meta_info": {**x.meta, "num_retractions": 0}})
        for x in got
        if x.label.startswith("prefix-")
    ]
    bad = long_context.accept_problems(spec, blind)
    assert [p.split(":")[0] for p in bad] == ["prefix-first", "prefix-repeat"]
    assert "(completion 32 / verify 5) != predicted 5.3333 (32 / 6)" in bad[0]


@pytest.mark.parametrize("name", MTP)
@pytest.mark.parametrize("broken", ["first-round-lost", "one-draft-lost"])
def test_drafts_lost_after_the_chunked_prefill_fail_acceptance_only(name, broken):
    spec = SPECS[name]
    got = collect(spec, broken)
    bad = long_context.accept_problems(spec, got)
    # every request that ran a verify step (the fake's abort victim stops at its prefill token): its long prompt was
    # prefilled in chunks, its first draft round came after that
    labels = [label for label, m in long_context.accept_metas(got) if m["completion_tokens"] > 1]
    assert [p.split(":")[0] for p in bad] == labels
    assert len(labels) == long_context.N_LIMIT + 2 + long_context.N_NEIGHBOURS
    assert all("!= predicted" in p for p in bad)
    # outputs, lengths, the cache hit, the abort and the no-MTP match all still pass: only acceptance sees it
    assert long_context.own_problems(spec, got) == bad
    assert long_context.against_reference(got, collect(NOMTP)) == []


def test_a_lost_draft_the_accept_length_hides_is_still_seen():
    # one draft lost in the prefix pair's first round: 31 tokens after the prefill still take 6 steps (5 x 6 + 1),
    # so the accept length stays 5.3333; the accepted-draft total (29, not 30) and the histogram show it
    spec = SPECS["long-witness-mtp-topk1"]
    repeat = next(x for x in collect(spec, "one-draft-lost") if x.label == "prefix-repeat")
    assert repeat.meta["spec_verify_ct"] == 6 and repeat.meta["spec_accept_length"] == 32 / 6
    (problem,) = long_context.accept_problems(spec, [repeat])
    assert "spec_num_correct_drafts 29 != predicted 30" in problem and "accept length" not in problem


def test_pool_report_reads_retractions_usage_and_leaks():
    log = (
        "Decode batch, #running-req: 4, full token usage: 0.91, swa token usage: 0.50, cuda graph: True\n"
        "Decode out of memory happened. #retracted_reqs: 2, #new_tokens_gained: 300\n"
        "Decode batch, #running-req: 2, token usage: 0.97\n"
        "Decode out of memory happened. #retracted_reqs: 1, #new_tokens_gained: 150\n"
    )
    got = long_context.pool_report(log)
    assert got == {"retracted_reqs": 3, "full_token_usage_peak": 0.97, "swa_token_usage_peak": 0.5, "leaks": []}
    leak = long_context.pool_report(log + "ValueError: token_to_kv_pool_allocator memory leak detected! full=3\n")
    assert leak["leaks"] == ["memory leak detected! full=3"]


def test_long_tight_settings_are_what_the_flags_ask():
    assert smoke_servers.long_tight_settings(TOPK3) == {
        "context_length": 256,
        "chunked_prefill_size": 32,
        "max_total_tokens": 640,
        "swa_full_tokens_ratio": 0.75,
        "page_size": 16,
    }
    assert smoke_servers.long_tight_settings(NOMTP)["swa_full_tokens_ratio"] == 0.5
    assert "page_size" not in smoke_servers.long_tight_settings(NOMTP)
    witness = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk1")
    assert smoke_servers.long_tight_settings(witness) == {}


def test_the_tier_checks_pass_on_the_intact_fake_and_name_the_kind_when_broken(tmp_path):
    from mtpmatrix.core.kinds import CheckFailure

    tier = tier_module()
    recorded: dict = {}

    def record(key, value):
        recorded[key] = value

    ok = fake_runs(tmp_path, log="Decode out of memory happened. #retracted_reqs: 2, #new_tokens_gained: 9\n")
    mtp = "long-witness-mtp-topk3-paged"
    for check in (
        tier.test_long_requests_run_to_the_limit,
        tier.test_long_prefix_hits_the_radix_cache,
        tier.test_long_abort_leaves_neighbours_exact,
        tier.test_long_match_no_mtp,
        tier.test_long_accept_exact,
        tier.test_long_pool_empty_when_idle,
    ):
        check(ok, mtp, record)
    assert recorded["retracted_reqs"] == 2 and recorded["cached_tokens"] == 96
    cases = [
        ("one-short", tier.test_long_requests_run_to_the_limit, "mismatch"),
        ("cached-zero", tier.test_long_prefix_hits_the_radix_cache, "accounting"),
        ("neighbour-changed", tier.test_long_abort_leaves_neighbours_exact, "mismatch"),
        ("neighbour-changed", tier.test_long_match_no_mtp, "mismatch"),
        ("first-round-lost", tier.test_long_accept_exact, "acceptance"),
    ]
    for broken, check, kind in cases:
        with pytest.raises(CheckFailure) as failed:
            check(fake_runs(tmp_path, broken), mtp, record)
        assert failed.value.kind == kind, (broken, str(failed.value))
    with pytest.raises(CheckFailure) as leaked:
        tier.test_long_pool_empty_when_idle(
            fake_runs(tmp_path, log="full memory leak detected! 3 tokens\n"), mtp, record
        )
    assert leaked.value.kind == "crash" and "memory leak detected! 3 tokens" in str(leaked.value)


# ---------------------------------------------------------------------------------------------- the catalogue's mutants
# Each long-context mutant of mtpmatrix.faults.catalogue.long_context, as what it makes sglang do (fake_long): the check
# its ``expect`` names fails on the MTP servers' answers (or log) while the no-MTP twin, where the edit is inert, passes.
def test_swa_verify_window_short_fails_the_rule_not_the_no_mtp_match(tmp_path):
    tier = tier_module()
    # the MTP servers broken, the no-MTP twin as intact sglang serves it (its Triton decode one key short)
    runs = fake_runs(tmp_path, "root-reads-short", twin="decode-one-short")
    for name in ("long-witness-mtp-topk1", "long-witness-mtp-topk3-paged"):
        with pytest.raises(CheckFailure) as failed:
            tier.test_long_requests_run_to_the_limit(runs, name, lambda *_: None)
        assert failed.value.kind == "mismatch" and "limit-0: token 1 is" in str(failed.value)
        with pytest.raises(CheckFailure):
            tier.test_long_abort_leaves_neighbours_exact(runs, name, lambda *_: None)
        # blind here: the broken root reads the window the twin's decode reads, so the two agree token for token
        tier.test_long_match_no_mtp(runs, name, lambda *_: None)
    # beside a twin that reads the rule (a Triton decode fixed upstream) the match sees it too
    runs = fake_runs(tmp_path, "root-reads-short")
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_match_no_mtp(runs, "long-witness-mtp-topk1", lambda *_: None)
    assert "output differs from no-MTP's" in str(failed.value)
    tier.test_long_requests_run_to_the_limit(runs, "long-witness-nomtp", lambda *_: None)
    tier.test_long_abort_leaves_neighbours_exact(runs, "long-witness-nomtp", lambda *_: None)


def test_spec_context_reserve_dropped_fails_the_over_limit_refusal():
    spec = SPECS["long-witness-mtp-topk1"]
    bad = long_context.length_problems(spec, collect(spec, "reserve-dropped"))
    assert bad == ["over-limit: asked 91 new tokens, answered"]  # every other request still ends where it should
    assert long_context.length_problems(NOMTP, collect(NOMTP, "reserve-dropped")) == []  # reserves nothing anyway


def test_spec_overalloc_tail_kept_fails_the_idle_pool_check(tmp_path):
    from mtpmatrix.core.kinds import CheckFailure

    tier = tier_module()
    # sglang 0.5.17's idle check (scheduler.on_idle -> invariant_checker._report_leak("pool", ...)), as its logger
    # writes it when a finished request's over-allocated slots are neither free nor in the radix tree
    # (its message: _check_pool_invariant's line per pool, joined by newlines)
    leak = (
        "[2026-12-05 02:00:00] pool memory leak detected! [full] total=640, available=520, evictable=96, "
        "protected=0, session_held=0, uncached=0\n[swa] total=320, available=320, evictable=0, protected=0, "
        "session_held=0, uncached=0\n"
    )
    runs = fake_runs(tmp_path, log=leak)
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_pool_empty_when_idle(runs, "long-witness-mtp-topk1", lambda *_: None)
    assert failed.value.kind == "crash" and "memory leak detected! [full] total=640, available=520" in str(failed.value)
    tier.test_long_pool_empty_when_idle(fake_runs(tmp_path), "long-witness-nomtp", lambda *_: None)


def test_frozen_kv_view_drops_cached_fails_only_the_acceptance_check(tmp_path):
    from mtpmatrix.core.kinds import CheckFailure

    tier = tier_module()
    runs = fake_runs(tmp_path, "view-drops-cached")  # the MTP servers broken, the no-MTP twin intact
    for name in ("long-witness-mtp-topk1", "long-witness-mtp-topk3-paged"):
        with pytest.raises(CheckFailure) as failed:
            tier.test_long_accept_exact(runs, name, lambda *_: None)
        assert failed.value.kind == "acceptance"
        bad = long_context.accept_problems(SPECS[name], runs[name].surface[long_context.NAME])
        # the repeat's every draft rejected: 31 verify steps for its 31 tokens after the prefill, predicted 6
        assert any(p.startswith("prefix-repeat: accept length 1.0323 (completion 32 / verify 31)") for p in bad), bad
        for check in (
            tier.test_long_requests_run_to_the_limit,
            tier.test_long_prefix_hits_the_radix_cache,
            tier.test_long_abort_leaves_neighbours_exact,
            tier.test_long_match_no_mtp,
        ):
            check(runs, name, lambda *_: None)  # every output, length, cache hit and the abort stay exact
    tier.test_long_requests_run_to_the_limit(runs, "long-witness-nomtp", lambda *_: None)


def test_retractions_that_kept_no_token_do_not_hide_a_lost_draft():
    # 0.5.17 topk 3 paged on the H200 (2026-12-05): a request retracted 34 times for 32 tokens; each retraction
    # keeps at most one re-prefill token, so the counters must be the exact pair's for some count up to the
    # retractions, every draft accepted
    from mtpmatrix.tiers.compat import meta_fields

    spec = SPECS["long-witness-mtp-topk1"]
    prompt = long_witness.prompts(1, long_context.PROMPT, seed=long_context.SEED_LIMIT)[0]

    def exchange(completion: int, retractions: int, kept: int, lost: int = 0) -> surface.Exchange:
        want = long_context.predicted_counters(completion, kept)
        hist = list(want["spec_correct_drafts_histogram"])
        if lost:
            hist[-1] -= 1
            hist[-1 - lost] += 1
        v = want["spec_verify_ct"]
        meta = {
            "completion_tokens": completion,
            "num_retractions": retractions,
            "spec_verify_ct": v,
            "spec_accept_length": completion / v,
            "spec_num_correct_drafts": want["spec_num_correct_drafts"] - lost,
            "spec_correct_drafts_histogram": hist,
        }
        out = long_context.expected(prompt, completion)
        return surface.Exchange("limit-0", {"input_ids": prompt}, {"output_ids": out, "meta_info": meta})

    assert long_context.accept_problems(spec, [exchange(90, 3, 1)]) == []  # 3 retractions, one kept a token
    assert long_context.accept_problems(spec, [exchange(90, 3, 3)]) == []
    assert long_context.accept_problems(spec, [exchange(90, 1, 5)])  # more re-prefill tokens than retractions
    assert long_context.accept_problems(spec, [exchange(90, 3, 1, lost=1)])  # a lost draft is still seen
    assert meta_fields.verified_tokens(32, 34) < 0  # the measured request: no lower end left, the upper one holds


def test_the_reads_record_keeps_ids_and_counters_of_every_output_off_the_rule():
    # an intact server's record is the reads alone; a deviating one's keeps what its signature is told by
    text = long_context.pair_text()
    intact = long_context.reads(collect(TOPK3), text)
    assert intact and all(set(r) == {"reads"} for r in intact.values())
    record = long_context.reads(collect(TOPK3, "tree-by-index"), text)
    off = {label: r for label, r in record.items() if "output_ids" in r}
    assert set(off) == set(record) - {"abort victim"}, sorted(off)  # the victim's one token is the edge's
    meta = off["limit-0"]["meta"]
    assert meta["spec_correct_drafts_histogram"][2] == meta["spec_verify_ct"] and "num_retractions" in meta
    served = next(x for x in collect(TOPK3, "tree-by-index") if x.label == "limit-0")
    assert off["limit-0"]["output_ids"] == list(served.output_ids)
