"""Smoke tier, the long-and-tight family (issue #38 item 2; mtpmatrix.tiers.surface.long_context): the long witness
served with a 640-token pool, 32-token prefill chunks and (topk 3) 16-token pages, given prompts past the window,
requests to the context limit, a shared prefix past the window and an abort mid-batch."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.tiny import configs
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import long_context

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
LONG = [s for s in SPECS if long_context.requests(s, 512)]
LONG_MTP = [s for s in LONG if s.topk]


def _exchanges(smoke_runs, name, record_property):
    run = replay_run(smoke_runs[name], record_property)
    exchanges = run.exchanges(long_context.NAME)
    planned = len(long_context.requests(run.spec, run.vocab_size))
    if len(exchanges) != planned:
        raise CheckFailure("harness", f"{len(exchanges)} {long_context.NAME} exchanges for {planned} planned requests")
    return run, exchanges


def _text() -> dict:
    """The long witness's text config as the smoke tier builds it (its window and RoPE decide every read)."""
    family = smoke_servers.collection_options().pair
    return configs.target_template(family, long_context.PAIR)["text_config"]


def _fail(kind: str, problems: list[str], what: str) -> None:
    if problems:
        raise CheckFailure(kind, f"{len(problems)} problem(s) over {what}; first: {problems[0]}")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in LONG])
def test_long_requests_run_to_the_limit(smoke_runs, name, record_property):
    """Prompts of 2.5 windows in 5 chunks, run together to the longest sglang admits on a pool that cannot hold
    them all at their end: each the long witness's rule token for token, finished "length" after exactly
    long_context.limit_new tokens; one token more is refused; the prefix pair's outputs exact too."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    record_property("limit_new_tokens", long_context.limit_new(run.spec.topk, long_context.PROMPT))
    record_property("reads", long_context.reads(exchanges, _text()))
    problems = long_context.length_problems(run.spec, exchanges)
    record_property("problems", problems[:20])
    _fail("mismatch", problems, f"{len(exchanges)} {long_context.NAME} requests")


@pytest.mark.check("accounting")
@pytest.mark.parametrize("name", [s.name for s in LONG])
def test_long_prefix_hits_the_radix_cache(smoke_runs, name, record_property):
    """The second of two prompts sharing 100 tokens (over 1.5 windows), sent after the first finished with nothing
    else in flight, reports the shared prefix cached (meta_info cached_tokens, in whole pages)."""
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    repeat = next((x for x in exchanges if x.label == "prefix-repeat"), None)
    record_property("cached_tokens", repeat.meta.get("cached_tokens") if repeat else None)
    _fail("accounting", long_context.cache_problems(_run.spec, repeat), "the prefix pair")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in LONG])
def test_long_abort_leaves_neighbours_exact(smoke_runs, name, record_property):
    """A request aborted (/abort_request) while it and a neighbour decode together (or, on the 16-page topk 3
    server, once retracted beside it) ends "abort" with a prefix of its rule output; the neighbour still runs to the
    limit exactly."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    x = next(x for x in exchanges if x.label == "abort")
    if x.error:
        raise CheckFailure("crash", f"abort group: {x.error}")
    record_property("abort_note", x.response.get("abort_note"))
    want = long_context.limit_new(run.spec.topk, long_context.PROMPT)
    problems = long_context.abort_problems(x, want, run.spec.topk, smoke_servers.page_size(run.spec))
    _fail("harness" if problems and "nothing was tested" in problems[0] else "mismatch", problems, "the abort group")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in LONG_MTP])
def test_long_match_no_mtp(smoke_runs, name, record_property):
    """Every long request's output on an MTP server equals the no-MTP twin's, token for token where both ran."""
    if long_context.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{long_context.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    reference = replay_run(smoke_runs[long_context.REFERENCE_SERVER], record_property)
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = long_context.against_reference(exchanges, reference.exchanges(long_context.NAME), _run.spec.topk)
    _fail("mismatch", problems, f"{len(exchanges)} {long_context.NAME} requests")


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in LONG_MTP])
def test_long_accept_exact(smoke_runs, name, record_property):
    """Every long request's own acceptance on an MTP server is what the exact pair gives: every draft accepted, so
    spec_verify_ct = ceil((completion_tokens - 1 - k) / 6) for some k re-prefill tokens, 0 <= k <= num_retractions,
    spec_num_correct_drafts 5 per verify step, accept length their ratio (long_context.predicted_counters; the limit
    requests, the prefix pair, the abort's neighbours and victim). Exact: a draft lost after a chunked prefill, a
    radix hit or near the context limit shows here, and nowhere else (outputs stay exact); on 16-token pages too at
    topk 1. At topk 3 where a release's own tree deviation is excused (0.5.17's windows by index, 0.5.13's extend one
    key wide) a draft lost past depth 1 is not told apart from a sibling that did not match (the entries say so)."""
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    record_property(
        "accept_lengths",
        {label: meta.get("spec_accept_length") for label, meta in long_context.accept_metas(exchanges)},
    )
    problems = long_context.accept_problems(_run.spec, exchanges)
    record_property("problems", problems[:20])
    _fail("acceptance", problems, f"{len(exchanges)} {long_context.NAME} requests")


@pytest.mark.check("crash")
@pytest.mark.parametrize("name", [s.name for s in LONG])
def test_long_pool_empty_when_idle(smoke_runs, name, record_property):
    """sglang's own idle check found every pool back to empty (no "memory leak detected!" in the server log).
    Recorded beside it, as measurements with no threshold yet (docs/gpu-boxes.md, first GPU run): the requests
    retracted and each pool's peak use."""
    run = replay_run(smoke_runs[name], record_property)
    report = long_context.pool_report(run.log_text)
    for key, value in report.items():
        record_property(key, value)
    _fail("crash", report["leaks"], "the server log's idle checks")
