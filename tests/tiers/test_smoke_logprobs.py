"""Smoke tier, request family "logprobs" (mtpmatrix.tiers.surface.logprobs): output and input logprobs of the
witness servers, with and without MTP, token by token."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import logprobs

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if s.pair == logprobs.PAIR]
WITNESS_MTP = [s for s in WITNESS if s.topk]


def _fail(kind: str, problems: list[str], n: int, what: str) -> None:
    if problems:
        raise CheckFailure(kind, f"{len(problems)} problem(s) over {n} {what}; first: {problems[0]}")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_logprobs_match_no_mtp(smoke_runs, name, record_property):
    """Every logprob request (greedy, and temperature 0.5 with top_k 1) on an MTP witness server: output ids on the
    +1 chain; output_token_logprobs name the output ids; rank 1 of output_top_logprobs is the output token with
    logprob >= logprobs.OWN_FLOOR (-0.216: the token is its row's peak; a reading from a neighbouring node is <=
    -7.66); and, per position, the rank-1 token and every token both top-5 lists hold within
    logprobs.TOLERANCE_NATS (0.656 / temperature: bf16 rounding of the same hidden state through the lm_head and
    softcap, derived in the module) of the witness without MTP. Failures name the position as prefill token,
    accepted draft or bonus."""
    if logprobs.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{logprobs.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    ref_run = replay_run(smoke_runs[logprobs.REFERENCE_SERVER], record_property)
    run = replay_run(smoke_runs[name], record_property)
    ref = {x.label: x for x in ref_run.exchanges(logprobs.NAME)}
    exchanges = run.exchanges(logprobs.NAME)
    record_property("tolerance_nats", round(logprobs.TOLERANCE_NATS, 4))
    record_property("own_floor_nats", round(logprobs.OWN_FLOOR, 4))
    record_property("token_logprobs", {x.label: [lp for lp, _t in logprobs.token_logprobs(x.meta)] for x in exchanges})
    record_property(
        "reference_token_logprobs", {x.label: [lp for lp, _t in logprobs.token_logprobs(x.meta)] for x in ref.values()}
    )
    if len(exchanges) != len(logprobs.requests(run.spec, run.vocab_size)):
        raise CheckFailure(
            "crash", f"{len(exchanges)} logprob exchanges, {len(logprobs.requests(run.spec, run.vocab_size))} sent"
        )
    problems = []
    for ex in exchanges:
        own = logprobs.own_problems(ex)
        problems += own
        if own:
            continue
        if ex.label not in ref:
            problems.append(f"{ex.label}: no such request on {logprobs.REFERENCE_SERVER}")
            continue
        problems += logprobs.compare_exchange(ex, ref[ex.label])
    record_property("problems", problems[:20])
    _fail("mismatch", problems, len(exchanges), "logprob requests")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_input_logprobs_at_prefill(smoke_runs, name, record_property):
    """Input logprobs (logprob_start_len 0) on every witness server, with MTP and without: one entry per prompt
    token (the first without a value); each prompt token (the prompts are +1 chains) rank 1 of its row with
    logprob >= logprobs.OWN_FLOOR; and each prefill row equal within logprobs.TOLERANCE_NATS to the output row the
    same server returned for the same input token in another request (a witness row depends on its input token
    alone): the prefill is the reference for verify's rows, no other server needed. sglang computes input
    logprobs in the target's own extend forward, untouched by MTP (module docstring)."""
    run = replay_run(smoke_runs[name], record_property)
    exchanges = run.exchanges(logprobs.NAME)
    record_property(
        "input_token_logprobs",
        {x.label: [lp for lp, _t in logprobs.token_logprobs(x.meta, "input_token_logprobs")] for x in exchanges},
    )
    if not exchanges:
        raise CheckFailure("crash", "no logprob exchanges collected")
    problems = logprobs.input_problems(exchanges)
    record_property("problems", problems[:20])
    _fail("mismatch", problems, len(exchanges), "logprob requests")
