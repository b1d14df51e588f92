"""The long-and-tight family (issue #38 item 2) end to end against the fake sglang (fake_long.LongWitnessShapes):
its requests go through the client as the smoke tier sends them (one batch, then the ALONE ones one at a time; the
abort streamed, the abort sent mid-batch), and its checks pass on the intact fake and fail on a fake broken the way
each check exists to catch."""

from __future__ import annotations

import pytest
from fake_long import LongWitnessShapes
from fake_sglang import FakeSglang

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs import long_witness
from mtpmatrix.serving import abort, client
from mtpmatrix.tiers import surface
from mtpmatrix.tiers.surface import long_context, long_deviations

SPECS = {s.name: s for s in smoke_servers.SMOKE_SERVERS if s.name in smoke_servers.LONG_SERVERS}
MTP_NAMES = [n for n, s in SPECS.items() if s.topk]
NOMTP = SPECS["long-witness-nomtp"]
TOPK3 = SPECS["long-witness-mtp-topk3-paged"]


def collect(
    spec, broken: str = "", retract_after: int | None = None, queued_victim: bool = False
) -> list[surface.Exchange]:
    """The family's requests for ``spec`` as mtpmatrix.tiers.smoke.collect sends them, against a fake."""
    labelled, alone = surface.split_alone(
        [(long_context.NAME, label, p) for label, p in long_context.requests(spec, 512)]
    )
    shapes = LongWitnessShapes(spec.topk, smoke_servers.page_size(spec), broken, retract_after, queued_victim)
    with FakeSglang(shapes=shapes) as fake:
        results = client.run_batch(fake.base_url, [p for _f, _l, p in labelled], parallel=16)
        results += client.run_batch(fake.base_url, [p for _f, _l, p in alone], parallel=1)
    return surface.collate(labelled + alone, results)[long_context.NAME]


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
    assert long_context.abort_problems(x, long_context.limit_new(TOPK3.topk, long_context.PROMPT), TOPK3.topk) == []


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


def _tier_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tests" / "tiers" / "test_smoke_long.py"
    spec = importlib.util.spec_from_file_location("test_smoke_long", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs(tmp_path, broken: str = "", log: str = "", twin: str = "") -> dict:
    """SmokeRuns of the long servers on the fake: the MTP ones ``broken``, the no-MTP twin ``twin``."""
    from mtpmatrix.tiers.smoke import SmokeRun

    return {
        name: SmokeRun(
            spec=spec,
            log_path=tmp_path / f"server-{name}.log",
            vocab_size=512,
            surface={long_context.NAME: collect(spec, broken if spec.topk else twin)},
            log_text=log,
        )
        for name, spec in SPECS.items()
    }


# ------------------------------------------------------------ intact sglang's no-MTP decode on the Triton backend
DECODE_ENTRY = "sglang-triton-swa-decode-window-one-short"


def _known_id(check_id: str, failure: CheckFailure) -> str | None:
    """The known-upstream entry (of every entry) that matches this failure of ``check_id``, or None."""
    from mtpmatrix.core import known_upstream

    record = {
        "id": check_id,
        "outcome": "failed",
        "failure": {"kind": failure.kind, "type": "CheckFailure", "message": str(failure)},
    }
    return next((k.id for k in known_upstream.load() if k.matches(record)), None)


def test_the_triton_decode_one_key_short_is_named_and_matches_its_entry_only(tmp_path):
    # what sglang 0.5.17 served on an H200 (2026-12-05): the no-MTP twin's decode tokens read offset 51, the MTP
    # servers' verify the rule; each check then fails with the known signature, and nothing else does
    tier = _tier_module()
    runs = _runs(tmp_path, twin="decode-one-short")
    for check, name in (
        (tier.test_long_requests_run_to_the_limit, "long-witness-nomtp"),
        (tier.test_long_abort_leaves_neighbours_exact, "long-witness-nomtp"),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk1"),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk3-paged"),
    ):
        with pytest.raises(CheckFailure) as failed:
            check(runs, name, lambda *_: None)
        assert long_deviations.DECODE_SHORT in str(failed.value), str(failed.value)
        check_id = f"tests/tiers/test_smoke_long.py::{check.__name__}[{name}]"
        assert _known_id(check_id, failed.value) == DECODE_ENTRY, str(failed.value)
    for name in ("long-witness-mtp-topk1", "long-witness-mtp-topk3-paged"):  # the MTP servers' own checks pass
        tier.test_long_requests_run_to_the_limit(runs, name, lambda *_: None)
        tier.test_long_abort_leaves_neighbours_exact(runs, name, lambda *_: None)
        tier.test_long_accept_exact(runs, name, lambda *_: None)


def test_the_tree_verify_by_index_is_named_and_matches_its_entries(tmp_path):
    # sglang 0.5.17's topk 3 server on the H200 (2026-12-05): each verify step keeps 2 drafts, then a bonus read short
    tier = _tier_module()
    runs = _runs(tmp_path, "tree-by-index")  # the topk 1 server is untouched by it (index = depth)
    name = "long-witness-mtp-topk3-paged"
    for check, entry in (
        (tier.test_long_requests_run_to_the_limit, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_abort_leaves_neighbours_exact, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_match_no_mtp, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_accept_exact, "sglang-triton-swa-tree-verify-window-by-index-acceptance"),
    ):
        with pytest.raises(CheckFailure) as failed:
            check(runs, name, lambda *_: None)
        assert long_deviations.TREE_SHORT in str(failed.value), str(failed.value)
        assert _known_id(f"tests/tiers/test_smoke_long.py::{check.__name__}[{name}]", failed.value) == entry
    for check in (tier.test_long_requests_run_to_the_limit, tier.test_long_accept_exact, tier.test_long_match_no_mtp):
        check(runs, "long-witness-mtp-topk1", lambda *_: None)
    # beside the no-MTP twin as 0.5.17 decodes it: the match names both, the first entry to match takes it
    runs = _runs(tmp_path, "tree-by-index", twin="decode-one-short")
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_match_no_mtp(runs, name, lambda *_: None)
    assert f"the no-MTP twin {long_deviations.DECODE_SHORT}; the MTP output {long_deviations.TREE_SHORT}" in str(
        failed.value
    )
    assert _known_id(f"tests/tiers/test_smoke_long.py::test_long_match_no_mtp[{name}]", failed.value)


def test_the_on_demand_long_servers_measured_on_0517_match_the_same_entries(tmp_path):
    # 0.5.17 on the H200 (2026-12-05, the six long servers): the unpaged topk 3 server verifies its tree by index and
    # the paged no-MTP one decodes one key short, as their default twins; the paged topk 1 server follows the rule
    from mtpmatrix.tiers.smoke import SmokeRun

    tier = _tier_module()
    on_demand = {s.name: s for s in smoke_servers.SMOKE_SERVERS if s.pair == long_context.PAIR and not s.default}
    assert set(on_demand) == {"long-witness-mtp-topk3", "long-witness-mtp-topk1-paged", "long-witness-nomtp-paged"}
    specs = {**on_demand, "long-witness-nomtp": NOMTP}
    runs = {
        name: SmokeRun(
            spec=spec,
            log_path=tmp_path / f"server-{name}.log",
            vocab_size=512,
            surface={long_context.NAME: collect(spec, "tree-by-index" if spec.topk else "decode-one-short")},
            log_text="",
        )
        for name, spec in specs.items()
    }
    tree = "sglang-triton-swa-tree-verify-window-by-index"
    for check, name, entry in (
        (tier.test_long_requests_run_to_the_limit, "long-witness-nomtp-paged", DECODE_ENTRY),
        (tier.test_long_abort_leaves_neighbours_exact, "long-witness-nomtp-paged", DECODE_ENTRY),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk1-paged", DECODE_ENTRY),
        (tier.test_long_requests_run_to_the_limit, "long-witness-mtp-topk3", tree),
        (tier.test_long_abort_leaves_neighbours_exact, "long-witness-mtp-topk3", tree),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk3", DECODE_ENTRY),  # the twin's deviation is named first
        (tier.test_long_accept_exact, "long-witness-mtp-topk3", f"{tree}-acceptance"),
    ):
        with pytest.raises(CheckFailure) as failed:
            check(runs, name, lambda *_: None)
        check_id = f"tests/tiers/test_smoke_long.py::{check.__name__}[{name}]"
        assert _known_id(check_id, failed.value) == entry, (check_id, str(failed.value))
    for check in (tier.test_long_requests_run_to_the_limit, tier.test_long_accept_exact):
        check(runs, "long-witness-mtp-topk1-paged", lambda *_: None)


def _reads(kinds: str) -> long_deviations.Reads:
    """Reads of a made-up output, one letter a token (long_witness.read_kinds': ``=`` the edge's and the short's)."""
    return long_deviations.Reads(["rs" if k == "=" else k for k in kinds], [], long_context.PROMPT)


def test_the_tree_signature_is_two_kept_before_each_short_read():
    assert long_deviations.tree_reads_short("rrrs=rsrrs") and long_deviations.tree_reads_short("rrrsrrrs")
    assert not long_deviations.tree_reads_short("rsss")  # the root read short (swa-verify-window-short)
    assert not long_deviations.tree_reads_short("rrrsrs")  # a step that kept one draft
    assert not long_deviations.tree_reads_short("srrs") and not long_deviations.tree_reads_short("rrrxrrs")
    assert not long_deviations.tree_reads_short("rrrrr")  # nothing short: not this deviation
    # on the MTP servers the root reading short (the catalogue's mutant) is never excused
    tree = {"completion_tokens": 10, "spec_verify_ct": 3, "spec_correct_drafts_histogram": [0, 0, 3, 0, 0, 0]}
    assert long_deviations.known_reads(_reads("rrrsrrs"), 3, tree) == long_deviations.TREE_SHORT
    assert (
        long_deviations.known_reads(_reads("rssss"), 3, tree) is None
        and long_deviations.known_reads(_reads("rssss"), 1, {}) is None
    )
    assert long_deviations.known_reads(_reads("rssss"), None, {}) == long_deviations.DECODE_SHORT
    assert long_deviations.known_reads(_reads("rrrsrrs"), 1, tree) is None  # topk 1 verifies a chain: index = depth
    # a short read where every draft was kept is no tree windowed by index (the review's cases, 2026-12-05): one
    # short read in an exact output, or every step's bonus read short with its five drafts kept
    exact = {"completion_tokens": 13, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 0, 0, 0, 2]}
    assert long_deviations.known_reads(_reads("rrrrrsrrrrrs"), 3, exact) is None
    assert long_deviations.tree_counters(tree, "rrrsrrs")
    assert not long_deviations.tree_counters(dict(tree, completion_tokens=13), "rrrsrrs")  # counters not the output's
    assert not long_deviations.tree_counters(
        dict(tree, spec_verify_ct=1, spec_correct_drafts_histogram=[0, 0, 1]), "ss"
    )
    assert not long_deviations.tree_counters(dict(tree, spec_correct_drafts_histogram=[0, 1, 2]), "s")  # one kept


def test_the_known_signature_never_covers_another_fault(tmp_path):
    tier = _tier_module()
    # the same read pattern on an MTP server (the catalogue's swa-verify-window-short) is no known deviation
    runs = _runs(tmp_path, "root-reads-short", twin="decode-one-short")
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_requests_run_to_the_limit(runs, "long-witness-mtp-topk1", lambda *_: None)
    assert long_deviations.DECODE_SHORT not in str(failed.value)
    check_id = "tests/tiers/test_smoke_long.py::test_long_requests_run_to_the_limit[long-witness-nomtp]"
    assert _known_id(check_id, failed.value) is None
    # another fault beside it on the no-MTP server is named first, so the failure is not the known one
    both = long_context.own_problems(NOMTP, collect(NOMTP, "decode-one-short")) + ["limit-9: 93 output ids"]
    assert long_deviations.DECODE_SHORT not in long_deviations.known_last(both)[0]
    # a no-MTP output one token off the short-window read is not the signature (a read that is neither)
    prompt = long_witness.prompts(1, long_context.PROMPT, seed=long_context.SEED_LIMIT)[0]
    got = collect(NOMTP, "decode-one-short")[0].output_ids
    kinds = long_witness.read_kinds(prompt, got, long_context.pair_text())
    assert long_deviations.decode_reads_short(kinds, 0)
    bent = got[:5] + [long_witness.body_token(0, (long_witness.member_of(got[5]) + 7) % 31)] + got[6:]
    assert not long_deviations.decode_reads_short(long_witness.read_kinds(prompt, bent, long_context.pair_text()), 0)
    # nor the rule's own output (nothing read short), nor a decode token at the edge beyond the retractions
    assert not long_deviations.decode_reads_short("r=rrr", 0)
    assert not long_deviations.decode_reads_short("rssrs", 0) and long_deviations.decode_reads_short("rssrs", 1)
    # the rule for a while, then short, is no decode one key short, however many retractions (two edge reads in a row)
    assert not long_deviations.decode_reads_short("r" * 25 + "s" * 60, 34)


def test_the_tier_checks_pass_on_the_intact_fake_and_name_the_kind_when_broken(tmp_path):
    from mtpmatrix.core.kinds import CheckFailure

    tier = _tier_module()
    recorded: dict = {}

    def record(key, value):
        recorded[key] = value

    ok = _runs(tmp_path, log="Decode out of memory happened. #retracted_reqs: 2, #new_tokens_gained: 9\n")
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
            check(_runs(tmp_path, broken), mtp, record)
        assert failed.value.kind == kind, (broken, str(failed.value))
    with pytest.raises(CheckFailure) as leaked:
        tier.test_long_pool_empty_when_idle(_runs(tmp_path, log="full memory leak detected! 3 tokens\n"), mtp, record)
    assert leaked.value.kind == "crash" and "memory leak detected! 3 tokens" in str(leaked.value)


# ---------------------------------------------------------------------------------------------- the catalogue's mutants
# Each long-context mutant of mtpmatrix.faults.catalogue.long_context, as what it makes sglang do (fake_long): the check
# its ``expect`` names fails on the MTP servers' answers (or log) while the no-MTP twin, where the edit is inert, passes.
def test_swa_verify_window_short_fails_the_rule_not_the_no_mtp_match(tmp_path):
    tier = _tier_module()
    # the MTP servers broken, the no-MTP twin as intact sglang serves it (its Triton decode one key short)
    runs = _runs(tmp_path, "root-reads-short", twin="decode-one-short")
    for name in ("long-witness-mtp-topk1", "long-witness-mtp-topk3-paged"):
        with pytest.raises(CheckFailure) as failed:
            tier.test_long_requests_run_to_the_limit(runs, name, lambda *_: None)
        assert failed.value.kind == "mismatch" and "limit-0: token 1 is" in str(failed.value)
        with pytest.raises(CheckFailure):
            tier.test_long_abort_leaves_neighbours_exact(runs, name, lambda *_: None)
        # blind here: the broken root reads the window the twin's decode reads, so the two agree token for token
        tier.test_long_match_no_mtp(runs, name, lambda *_: None)
    # beside a twin that reads the rule (a Triton decode fixed upstream) the match sees it too
    runs = _runs(tmp_path, "root-reads-short")
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

    tier = _tier_module()
    # sglang 0.5.17's idle check (scheduler.on_idle -> invariant_checker._report_leak("pool", ...)), as its logger
    # writes it when a finished request's over-allocated slots are neither free nor in the radix tree
    # (its message: _check_pool_invariant's line per pool, joined by newlines)
    leak = (
        "[2026-12-05 02:00:00] pool memory leak detected! [full] total=640, available=520, evictable=96, "
        "protected=0, session_held=0, uncached=0\n[swa] total=320, available=320, evictable=0, protected=0, "
        "session_held=0, uncached=0\n"
    )
    runs = _runs(tmp_path, log=leak)
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_pool_empty_when_idle(runs, "long-witness-mtp-topk1", lambda *_: None)
    assert failed.value.kind == "crash" and "memory leak detected! [full] total=640, available=520" in str(failed.value)
    tier.test_long_pool_empty_when_idle(_runs(tmp_path), "long-witness-nomtp", lambda *_: None)


def test_frozen_kv_view_drops_cached_fails_only_the_acceptance_check(tmp_path):
    from mtpmatrix.core.kinds import CheckFailure

    tier = _tier_module()
    runs = _runs(tmp_path, "view-drops-cached")  # the MTP servers broken, the no-MTP twin intact
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


def test_a_window_one_key_wide_is_read_as_such_and_named_as_0513s_only():
    # sglang 0.5.13 on the H200 (2026-12-05): the prefill's token read the trap just outside the window, the decode
    # tokens through the short window; every token is named, the output as 0.5.13's deviation, none as 0.5.17's
    text = long_context.pair_text()
    prompt = long_witness.prompts(1, long_context.PROMPT, seed=long_context.SEED_LIMIT)[0]
    ids = list(prompt)
    for window in [long_context.WINDOW] + [long_context.WINDOW - 2] * 20:  # one key wide, then one key short
        ids.append(long_witness.predicted_next(ids, text, visible_max=window)[-1])
    kinds = long_witness.read_kinds(prompt, ids[len(prompt) :], text)
    assert kinds[0] == long_witness.READ_WIDE and set(kinds[1:]) <= {long_witness.READ_SHORT, long_witness.READ_BOTH}
    tree = {"completion_tokens": 22, "spec_verify_ct": 7, "spec_correct_drafts_histogram": [0, 0, 7, 0, 0, 0]}
    reads = long_deviations.served_reads(prompt, ids[len(prompt) :], text)
    assert long_deviations.known_reads(reads, None, {}) == long_deviations.EXTEND_WIDE
    assert long_deviations.known_reads(reads, 3, tree) is None  # an MTP server's steps are not a decode's
    # an output holding another group's key token is read as none of the rule's, not a harness error
    stray = ids[len(prompt) :][:5] + [long_witness.key_token(3)]
    assert long_witness.read_kinds(prompt, stray, text) == long_witness.READ_OTHER * len(stray)


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
