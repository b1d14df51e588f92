"""sglang's measured sliding-window deviations as the long family names them (tiers/surface/long_deviations.py), each
against its known-upstream entries: 0.5.17's Triton decode one key short and tree verify windowed by index, and
0.5.13's extend rows one key wide (sglang-0513-gemma4-swa-extend-window-one-wide), whose signature
(long_deviations.extend_reads_wide) holds every long output 0.5.13 served on the H200 and no other fault. On fakes
serving each deviation the checks name it and only its entries match; no other fault is excused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from long_runs import DECODE_ENTRY, NOMTP, SPECS, collect, failure_of, fake_runs, known_id, tier_module

from mtpmatrix.core import known_upstream, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs import long_witness
from mtpmatrix.tiers.surface import long_context, long_deviations

# ------------------------------------------------------------------ sglang 0.5.13's extend rows one key wide
SERVED = json.loads((Path(__file__).parent / "data" / "long_witness_0513_h200.json").read_text())
TOPK = {name: spec.topk for name, spec in SPECS.items()}
ENTRY = "sglang-0513-gemma4-swa-extend-window-one-wide"


def _prompts() -> dict[str, list[int]]:
    """The family's prompts by the label its reads are recorded under."""
    payloads = dict(long_context.requests(SPECS["long-witness-nomtp"], 512))
    out = {label: p["input_ids"] for label, p in payloads.items() if isinstance(p, dict)}
    group = payloads["abort"]
    return {**out, "abort neighbour 0": group.neighbours[0]["input_ids"], "abort victim": group.victim["input_ids"]}


PROMPTS = _prompts()
MEASURED = [(server, label) for server, answers in SERVED["servers"].items() for label in answers]


def measured_reads(server: str, label: str, output: list[int] | None = None) -> long_deviations.Reads:
    output = SERVED["servers"][server][label]["output_ids"] if output is None else output
    return long_deviations.served_reads(PROMPTS[label], output, long_context.pair_text())


def made_up(tokens: list[str], after: list[str] = (), prompt_len: int = 100) -> long_deviations.Reads:
    """Reads of a made-up output: its tokens' read sets, the rule's continuation's, a prompt of ``prompt_len`` (100:
    no position of these outputs is a one-row chunk's)."""
    return long_deviations.Reads(list(tokens), list(after), prompt_len)


@pytest.mark.parametrize("server,label", MEASURED)
def test_every_long_output_0513_served_is_the_signature(server, label):
    meta = SERVED["servers"][server][label]["meta"]
    assert long_deviations.known_reads(measured_reads(server, label), TOPK[server], meta) == long_deviations.EXTEND_WIDE


def test_23_outputs_on_three_servers_were_measured():
    assert len(MEASURED) == 23 and set(SERVED["servers"]) == set(SPECS)


def _kept_two_somewhere(server: str, label: str) -> bool:
    """An MTP answer with a step that kept two drafts or more: one of them lost still leaves no step keeping none."""
    hist = SERVED["servers"][server][label]["meta"].get("spec_correct_drafts_histogram") or []
    return any(hist[2:])


@pytest.mark.parametrize("server,label", [m for m in MEASURED if TOPK[m[0]] and _kept_two_somewhere(*m)])
def test_a_lost_draft_beside_it_is_not_the_signature(server, label):
    # the same output with one step's last kept draft lost (counted one bin lower) no longer splits into its steps
    meta = SERVED["servers"][server][label]["meta"]
    hist = list(meta["spec_correct_drafts_histogram"])
    top = max(i for i, h in enumerate(hist) if h)
    lost = [h - (i == top) + (i == top - 1) for i, h in enumerate(hist)]
    assert not long_deviations.extend_reads_wide(
        measured_reads(server, label), TOPK[server], {**meta, "spec_correct_drafts_histogram": lost}
    )


@pytest.mark.parametrize("server,label", MEASURED)
def test_one_token_no_read_gives_is_not_the_signature(server, label):
    served = SERVED["servers"][server][label]
    got = list(served["output_ids"])
    at = len(got) // 2
    group = long_witness.key_group_of(PROMPTS[label][1])
    text = long_context.pair_text()
    for member in range(long_witness.CYCLE):
        got[at] = long_witness.body_token(group, member)
        if not long_witness.read_sets(PROMPTS[label], got, text)[at]:
            break
    assert not long_witness.read_sets(PROMPTS[label], got, text)[at]
    assert long_deviations.known_reads(measured_reads(server, label, got), TOPK[server], served["meta"]) is None


def test_the_signature_holds_only_its_own_reads():
    def wide(tokens, topk, meta, after=(), prompt_len=100):
        if "spec_correct_drafts_histogram" in meta:  # the answer's other counters agree unless the case says otherwise
            hist = meta["spec_correct_drafts_histogram"]
            meta = {"completion_tokens": len(tokens), "spec_verify_ct": sum(hist), **meta}
        return long_deviations.extend_reads_wide(made_up(tokens, after, prompt_len), topk, meta)

    def exactly(tokens, topk, meta):  # the counters as given, none filled in
        return long_deviations.extend_reads_wide(made_up(tokens), topk, meta)

    one = {"spec_correct_drafts_histogram": [0, 2], "num_retractions": 0}
    assert wide(["w", "r", "w", "r", "w"], 1, one)
    # the prefill's last chunk may be one row (the chunk budget is shared with the batch's other prefills): the edge
    assert wide(["r", "r", "w", "r", "w"], 1, one) and not wide(["s", "r", "w", "r", "w"], 1, one)
    assert not wide(["w", "s", "w", "r", "w"], 1, one)  # a root read short (the catalogue's swa-verify-window-short)
    assert not wide(["w", "r", "", "r", "w"], 1, one)  # a token no read gives
    assert not wide(["w", "r", "r", "r", "w"], 1, {**one, "spec_correct_drafts_histogram": [0, 1, 1]})  # node at edge
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_correct_drafts_histogram": [1, 2]})  # a step kept none
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_correct_drafts_histogram": [0, 3]})  # a step too many
    assert not wide(["w", "r", "w", "r", "w"], 1, {})  # no counters: nothing to split by
    # the verify steps and completion tokens must be reported, not only agree where they are
    assert not exactly(["w", "r", "w", "r", "w"], 1, {"spec_correct_drafts_histogram": [0, 2], "completion_tokens": 5})
    assert not exactly(["w", "r", "w", "r", "w"], 1, {"spec_correct_drafts_histogram": [0, 2], "spec_verify_ct": 2})
    # an answer made at prefill alone (an abort victim): its counters say so, or it is not one
    assert exactly(["w"], 1, {"completion_tokens": 1}) and not exactly(["w", "w"], 1, {"completion_tokens": 2})
    assert not exactly(["w"], 1, {}) and not exactly(["w"], 1, {"completion_tokens": 40})  # the review's cases
    prefills = {"completion_tokens": 2, "num_retractions": 1}
    assert exactly(["w", "w"], 1, prefills)
    assert not exactly(["w", "w"], 1, {**prefills, "spec_correct_drafts_histogram": [3, 0, 0]})
    assert not exactly(["w", "w"], 1, {**prefills, "spec_num_correct_drafts": 2})
    assert not wide(["w", "r", "r", "r", "r"], 1, one)  # the rule after the first token: not this deviation
    # the counters must be the histogram's and the output's
    assert wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_verify_ct": 2, "spec_num_correct_drafts": 2})
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_verify_ct": 3})
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_num_correct_drafts": 4})
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "completion_tokens": 9})
    assert not wide(["w", "r", "w", "r", "w"], 1, {**one, "spec_correct_drafts_histogram": [0, 2, 0, 0, 0, 0, 9]})
    # a draft kept where both reads agree; a bonus the edge's too is a draft that would have been kept
    assert wide(["w", "r", "rw", "w", "r", "w"], 1, {"spec_correct_drafts_histogram": [0, 1, 1]})
    assert not wide(["w", "r", "rw", "r", "w"], 1, {"spec_correct_drafts_histogram": [0, 2]})
    # the last step cut by the limit: the drafts it kept past the output are the rule's, read the same either way,
    # and its cut bonus one key wide where the rule's token is not
    assert wide(["w", "r", "w", "r"], 1, one, after=["r"])
    assert not wide(["w", "r", "w", "r"], 1, one, after=["rw"])  # the wide read would have kept that draft
    five = {"spec_correct_drafts_histogram": [0, 2, 0, 0, 0, 1]}
    assert not wide(["w", "r", "w", "r", "w", "r"], 1, five, after=["r"] * 5)  # five kept past the output: no
    assert wide(["w", "r", "w", "r", "w", "r"], 1, five, after=["rw"] * 4 + ["r"])
    assert not wide(["w", "r", "w", "r"], 1, one, after=[])  # nothing known past the output: no cut step
    # at topk 3 the top child reads one key wide, nodes past it any read the flattened index gives
    assert wide(["w", "r", "rw", "s", "r", "w"], 3, {"spec_correct_drafts_histogram": [0, 1, 1]})
    assert not wide(["w", "r", "s", "r", "w"], 3, one)  # the top child read short
    # re-prefills: at most one token per retraction, one key wide, or the edge where its last chunk is one row
    assert wide(["w", "w", "r", "w", "r", "w"], 1, {**one, "num_retractions": 1})
    assert not wide(["w", "w", "r", "w", "r", "w"], 1, one)
    assert not wide(["w", "r", "r", "w", "r", "w"], 1, {**one, "num_retractions": 1})  # 101 rows: no edge re-prefill
    assert wide(["w", "r", "r", "w", "r", "w"], 1, {**one, "num_retractions": 1}, prompt_len=160)  # 161 = 5 x 32 + 1
    # a lost draft beside a retraction does not pass as a re-prefill at the edge (the review's case)
    lost = ["w", "r", "w", "r", "r", "w", "r", "w"]
    assert not wide(lost, 1, {"spec_correct_drafts_histogram": [0, 3], "num_retractions": 1})
    # the prefill's own token at the edge or one key wide, whatever the prompt's length (known_reads names an edge
    # one with decode tokens short the decode's: test_an_output_both_could_be_is_the_decode_ones)
    assert wide(["r", "s", "s"], None, {}) and not wide(["s", "s", "s"], None, {})
    # no MTP: a decode one key short after the prefill's wide token; re-prefills as above
    assert wide(["w", "s", "s", "rs", "s"], None, {})
    assert not wide(["w", "s", "w", "s"], None, {}) and wide(["w", "s", "w", "s"], None, {"num_retractions": 1})
    assert not wide(["w", "s", "r", "s"], None, {"num_retractions": 1})  # 102 rows: an edge read is no re-prefill
    assert wide(["w", "s", "s", "r", "s"], None, {"num_retractions": 1}, prompt_len=158)
    assert wide(["w", "s", "w", "w", "s"], None, {"num_retractions": 2})  # back to back (measured under MTP)
    assert not wide(["w", "s", "", "s"], None, {"num_retractions": 1})


def test_one_releases_own_deviation_is_named_before_the_decodes_and_two_releases_never_pass():
    decode, tree, wide = (f"limit-{i}: {k} (...)" for i, k in enumerate(long_deviations.KNOWN_READS))
    assert long_deviations.known_last([decode, wide]) == [wide, decode]  # a 0.5.17 run must not hide a 0.5.13 read
    assert long_deviations.known_last([decode, tree]) == [tree, decode]
    assert long_deviations.known_last(["limit-9: 93 output ids", wide]) == ["limit-9: 93 output ids", wide]
    both = long_deviations.known_last([tree, wide, decode])
    assert both[0] == long_deviations.MIXED_RELEASES
    message = f"3 problem(s) over 8 long_context requests; first: {both[0]}"
    for name in ("long-witness-mtp-topk3-paged", "long-witness-nomtp"):
        check_id = f"tests/tiers/test_smoke_long.py::test_long_requests_run_to_the_limit[{name}]"
        assert known_id(check_id, CheckFailure("mismatch", message)) is None
    # a twin's 0.5.13 read beside a 0.5.17 tree is neither release's
    check_id = "tests/tiers/test_smoke_long.py::test_long_match_no_mtp[long-witness-mtp-topk3-paged]"
    mixed = f"the no-MTP twin {long_deviations.EXTEND_WIDE}; the MTP output {long_deviations.TREE_SHORT}"
    message = f"7 problem(s) over 8 long_context requests; first: limit-0: {mixed}"
    assert known_id(check_id, CheckFailure("mismatch", message)) is None


def test_an_output_both_could_be_is_the_decode_ones():
    # the prefill's token the same read at the edge and one key wide, every decode short: 0.5.17's pattern first
    assert long_deviations.known_reads(made_up(["rw", "s", "s"]), None, {}) == long_deviations.DECODE_SHORT
    assert long_deviations.known_reads(made_up(["w", "s", "s"]), None, {}) == long_deviations.EXTEND_WIDE


def test_0513s_reads_are_named_by_every_long_check_and_match_its_entries_only(tmp_path):
    tier = tier_module()
    runs = fake_runs(tmp_path, "extend-one-wide", twin="extend-one-wide")
    checks = [(tier.test_long_requests_run_to_the_limit, name, ENTRY) for name in SPECS] + [
        (tier.test_long_abort_leaves_neighbours_exact, name, ENTRY) for name in SPECS
    ]
    checks += [(tier.test_long_match_no_mtp, name, ENTRY) for name in SPECS if TOPK[name]]
    checks += [(tier.test_long_accept_exact, name, f"{ENTRY}-acceptance") for name in SPECS if TOPK[name]]
    for check, name, entry in checks:
        failure, matched = failure_of(check, runs, name)
        assert long_deviations.EXTEND_WIDE in str(failure), (check.__name__, name, str(failure))
        assert matched == entry, (check.__name__, name, str(failure))
    tier.test_long_prefix_hits_the_radix_cache(runs, "long-witness-mtp-topk1", lambda *_: None)


def test_its_entries_cover_0513_only_and_list_the_checks_it_fails():
    entries = {k.id: k for k in known_upstream.load()}
    for entry_id in (ENTRY, f"{ENTRY}-acceptance"):
        entry = entries[entry_id]
        assert entry.applies_to({"sglang": "0.5.13"}) and not entry.applies_to({"sglang": "0.5.14"})
        assert entry.fixed_in == "0.5.14" and "26147" in entry.upstream
    assert entries["sglang-triton-swa-decode-window-one-short"].applies_to({"sglang": "0.5.13"})


def test_a_0513_mtp_output_beside_a_decode_short_twin_is_0513s_only():
    # the decode-short entry (0.5.13-0.5.17) takes a twin's decode one key short only beside an MTP output it explains
    check_id = "tests/tiers/test_smoke_long.py::test_long_match_no_mtp[long-witness-mtp-topk1]"
    twin = f"the no-MTP twin {long_deviations.DECODE_SHORT}"
    for mtp, entry in (
        (long_deviations.EXTEND_WIDE, ENTRY),
        ("follows the rule", "sglang-triton-swa-decode-window-one-short"),
        ("output differs from no-MTP's", None),
    ):
        message = f"7 problem(s) over 8 long_context requests; first: limit-0: {twin}; the MTP output {mtp}"
        assert known_id(check_id, CheckFailure("mismatch", message)) == entry, message


def test_an_output_the_search_cannot_settle_in_its_states_is_not_excused(monkeypatch):
    # a measured output that fits, given fewer states than its split needs (the measured ones need 60 at most)
    server, label = "long-witness-mtp-topk3-paged", "abort neighbour 0"
    meta = SERVED["servers"][server][label]["meta"]
    assert long_deviations.extend_reads_wide(measured_reads(server, label), 3, meta)
    monkeypatch.setattr(long_deviations, "SPLITS_LIMIT", 10)
    assert not long_deviations.extend_reads_wide(measured_reads(server, label), 3, meta)


# ------------------------------------------------------------ sglang 0.5.17's Triton deviations (measured 2026-12-05)
def test_the_triton_decode_one_key_short_is_named_and_matches_its_entry_only(tmp_path):
    # what sglang 0.5.17 served on an H200 (2026-12-05): the no-MTP twin's decode tokens read offset 51, the MTP
    # servers' verify the rule; each check then fails with the known signature, and nothing else does
    tier = tier_module()
    runs = fake_runs(tmp_path, twin="decode-one-short")
    for check, name in (
        (tier.test_long_requests_run_to_the_limit, "long-witness-nomtp"),
        (tier.test_long_abort_leaves_neighbours_exact, "long-witness-nomtp"),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk1"),
        (tier.test_long_match_no_mtp, "long-witness-mtp-topk3-paged"),
    ):
        failure, matched = failure_of(check, runs, name)
        assert long_deviations.DECODE_SHORT in str(failure), str(failure)
        assert matched == DECODE_ENTRY, str(failure)
    for name in ("long-witness-mtp-topk1", "long-witness-mtp-topk3-paged"):  # the MTP servers' own checks pass
        tier.test_long_requests_run_to_the_limit(runs, name, lambda *_: None)
        tier.test_long_abort_leaves_neighbours_exact(runs, name, lambda *_: None)
        tier.test_long_accept_exact(runs, name, lambda *_: None)


def test_the_tree_verify_by_index_is_named_and_matches_its_entries(tmp_path):
    # sglang 0.5.17's topk 3 server on the H200 (2026-12-05): each verify step keeps 2 drafts, then a bonus read short
    tier = tier_module()
    runs = fake_runs(tmp_path, "tree-by-index")  # the topk 1 server is untouched by it (index = depth)
    name = "long-witness-mtp-topk3-paged"
    for check, entry in (
        (tier.test_long_requests_run_to_the_limit, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_abort_leaves_neighbours_exact, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_match_no_mtp, "sglang-triton-swa-tree-verify-window-by-index"),
        (tier.test_long_accept_exact, "sglang-triton-swa-tree-verify-window-by-index-acceptance"),
    ):
        failure, matched = failure_of(check, runs, name)
        assert long_deviations.TREE_SHORT in str(failure), str(failure)
        assert matched == entry
    for check in (tier.test_long_requests_run_to_the_limit, tier.test_long_accept_exact, tier.test_long_match_no_mtp):
        check(runs, "long-witness-mtp-topk1", lambda *_: None)
    # beside the no-MTP twin as 0.5.17 decodes it: the match names both, the first entry to match takes it
    runs = fake_runs(tmp_path, "tree-by-index", twin="decode-one-short")
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_match_no_mtp(runs, name, lambda *_: None)
    assert f"the no-MTP twin {long_deviations.DECODE_SHORT}; the MTP output {long_deviations.TREE_SHORT}" in str(
        failed.value
    )
    assert known_id(f"tests/tiers/test_smoke_long.py::test_long_match_no_mtp[{name}]", failed.value)


def test_the_on_demand_long_servers_measured_on_0517_match_the_same_entries(tmp_path):
    # 0.5.17 on the H200 (2026-12-05, the six long servers): the unpaged topk 3 server verifies its tree by index and
    # the paged no-MTP one decodes one key short, as their default twins; the paged topk 1 server follows the rule
    tier = tier_module()
    on_demand = {s.name: s for s in smoke_servers.SMOKE_SERVERS if s.pair == long_context.PAIR and not s.default}
    assert set(on_demand) == {"long-witness-mtp-topk3", "long-witness-mtp-topk1-paged", "long-witness-nomtp-paged"}
    specs = {**on_demand, "long-witness-nomtp": NOMTP}
    runs = fake_runs(tmp_path, "tree-by-index", twin="decode-one-short", specs=specs)
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
        failure, matched = failure_of(check, runs, name)
        assert matched == entry, (check.__name__, name, str(failure))
    for check in (tier.test_long_requests_run_to_the_limit, tier.test_long_accept_exact):
        check(runs, "long-witness-mtp-topk1-paged", lambda *_: None)


def from_kinds(kinds: str) -> long_deviations.Reads:
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
    assert long_deviations.known_reads(from_kinds("rrrsrrs"), 3, tree) == long_deviations.TREE_SHORT
    assert (
        long_deviations.known_reads(from_kinds("rssss"), 3, tree) is None
        and long_deviations.known_reads(from_kinds("rssss"), 1, {}) is None
    )
    assert long_deviations.known_reads(from_kinds("rssss"), None, {}) == long_deviations.DECODE_SHORT
    assert long_deviations.known_reads(from_kinds("rrrsrrs"), 1, tree) is None  # topk 1 verifies a chain: index = depth
    # a short read where every draft was kept is no tree windowed by index (the review's cases, 2026-12-05): one
    # short read in an exact output, or every step's bonus read short with its five drafts kept
    exact = {"completion_tokens": 13, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 0, 0, 0, 2]}
    assert long_deviations.known_reads(from_kinds("rrrrrsrrrrrs"), 3, exact) is None
    assert long_deviations.tree_counters(tree, "rrrsrrs")
    assert not long_deviations.tree_counters(dict(tree, completion_tokens=13), "rrrsrrs")  # counters not the output's
    assert not long_deviations.tree_counters(
        dict(tree, spec_verify_ct=1, spec_correct_drafts_histogram=[0, 0, 1]), "ss"
    )
    assert not long_deviations.tree_counters(dict(tree, spec_correct_drafts_histogram=[0, 1, 2]), "s")  # one kept
    # the review's counters that the output does not show (2026-12-05c): an output whose ten steps each visibly kept
    # two drafts, with a histogram inflated to 25 accepted drafts (within the general tail rule's five, past the
    # three a tree step can keep beyond the output), or accepted drafts that are not the histogram's
    kinds = "r" + "rrs" * 10
    honest = {"completion_tokens": 31, "spec_verify_ct": 10, "spec_correct_drafts_histogram": [0, 0, 10, 0]}
    assert long_deviations.tree_counters(dict(honest, spec_num_correct_drafts=20), kinds)
    assert not long_deviations.tree_counters(dict(honest, spec_correct_drafts_histogram=[0, 0, 5, 5]), kinds)
    assert not long_deviations.tree_counters(dict(honest, spec_num_correct_drafts=49), kinds)
    # H200, 0.5.17, 2026-12-05d: limit-1 (retracted once) kept four drafts in one step, its third and fourth tokens
    # read both ways (the depth-2 and depth-3 nodes' short windows give the rule's token there)
    measured = "rrrrsrrsrrsrrsrr==srrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsrrsr=sr=sr=sr="
    four = {
        "completion_tokens": 81,
        "num_retractions": 1,
        "spec_verify_ct": 26,
        "spec_num_correct_drafts": 54,
        "spec_correct_drafts_histogram": [0, 0, 25, 0, 1],
    }
    assert long_deviations.tree_reads_short(measured) and long_deviations.tree_counters(four, measured)
    # the same step with none of its deep tokens read both ways: a node past its depth kept a draft it reads short
    assert not long_deviations.tree_counters(four, measured.replace("=", "r"))
    # a deep draft of a step the limit cut: allowed only where the rule's token past the output reads both ways
    cut = {"completion_tokens": 7, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 1, 0, 1]}
    assert not long_deviations.tree_counters(cut, "rrrsrr") and long_deviations.tree_counters(cut, "rrrsrr", "r=r")


def test_the_known_signature_never_covers_another_fault(tmp_path):
    tier = tier_module()
    # the same read pattern on an MTP server (the catalogue's swa-verify-window-short) is no known deviation
    runs = fake_runs(tmp_path, "root-reads-short", twin="decode-one-short")
    with pytest.raises(CheckFailure) as failed:
        tier.test_long_requests_run_to_the_limit(runs, "long-witness-mtp-topk1", lambda *_: None)
    assert long_deviations.DECODE_SHORT not in str(failed.value)
    check_id = "tests/tiers/test_smoke_long.py::test_long_requests_run_to_the_limit[long-witness-nomtp]"
    assert known_id(check_id, failed.value) is None
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
    served = long_deviations.served_reads(prompt, ids[len(prompt) :], text)
    assert long_deviations.known_reads(served, None, {}) == long_deviations.EXTEND_WIDE
    assert long_deviations.known_reads(served, 3, tree) is None  # an MTP server's steps are not a decode's
    # an output holding another group's key token is read as none of the rule's, not a harness error
    stray = ids[len(prompt) :][:5] + [long_witness.key_token(3)]
    assert long_witness.read_kinds(prompt, stray, text) == long_witness.READ_OTHER * len(stray)
