"""Request family "features": the sampling features users set (logit_bias, min_new_tokens, frequency / presence /
repetition penalties, min_p), under MTP against no-MTP.

Which pair tells what, and why (sglang 0.5.13 / 0.5.17 read for every prediction):
  * witness (greedy, next = token + 1): exact, deterministic outputs; the witness-nomtp server answers the same
    requests, and most labels also have a prediction of their own (``predicted``) that needs no server:
      - ``logit-bias``: -100 on the chain's 4th token (an accepted draft of verify step 1): tokens 1-3 are the
        chain, the 4th is not (the bias moves it 100 nats below every other token), the chain then restarts from
        whatever wins there (the same token without MTP). sglang applies logit_bias in verify
        (0.5.13 ``eagle_info.py: EagleVerifyInput.verify``, 0.5.17 ``eagle_utils.py: eagle_sample``).
      - ``min-new-tokens-*``: ``stop_token_ids`` [chain token 9] (an accepted draft of verify step 2). sglang's
        min_new_tokens masks the stop set ``stop_token_ids | tokenizer eos | additional stop ids``
        (``penaltylib/min_new_tokens.py: BatchedMinNewTokensPenalizer._prepare``), not generation_config's
        END_OF_TURN_ID 12; and a chain through 12 from a prompt ending at 12 - k puts the multimodal special ids
        4-11 in the prompt; so the stop token here is a plain chain id named in stop_token_ids. ``masked``:
        min_new_tokens 32, the stop token is masked and the request runs to 32 tokens; ``released``:
        min_new_tokens 8, 8 tokens precede the stop token, so it is emitted and ends the request at 9 tokens.
      - ``*-penalty-*`` (frequency / presence +-2, repetition 2): no effect on the witness: the chain never
        repeats, so a penalised token is one already generated, never the row's peak (the new token x + 1), and
        +-2 nats on a token at most 9.82 (logprobs.RUNNER_UP) never reaches the peak's 17.48; output = the chain.
        sglang's penalties cover output tokens only, not the prompt (``penaltylib/repetition_penalty.py``,
        ``frequency_penalty.py``, ``presence_penalty.py``: ``_cumulate_output_tokens``; the orchestrator has no
        input-token hook), so a prompt holding a future chain token does not test them.
      - ``repetition-boost``: repetition_penalty 0.1 divides a generated token's positive logit by 0.1: any earlier
        token with logit > 1.75 in the current row beats the new peak, so the output jumps back and re-walks its
        own past (each re-walked token is the peak AND a past token: 175 vs <= 98), where the drafter's x + 1
        drafts are accepted: repeats with accepted drafts. No closed form (which earlier token wins depends on
        the code geometry): held to the no-MTP witness only.
      - ``custom-logit-processor``: a custom logit processor (top_token_swap.TopTokenSwap: where a row's top token
        is ``token_id``, it and ``instead`` swap logits), ``custom_params`` naming the chain's 4th token (the same
        accepted draft as logit-bias) and ``instead`` 40 ids past it: the chain's first 3 tokens, then ``instead``
        (7.66 nats clear) and the chain on from it: exact. sglang refuses the request unless the server runs with
        ``--enable-custom-logit-processor`` (``managers/tokenizer_manager.py``), which the witness servers set
        (smoke_servers.CUSTOM_LOGIT_PROCESSOR_ARGS).
  * sampled (temperature 0.7, closed form in mtpmatrix.pairs.sampled): ``min-p``: min_p 0.26 with no top-k /
    top-p keeps offsets d1-d3 (probability ratios to d1: 0.586, 0.344) and cuts d4 (0.201) and every other token:
    the kept set and law of ring.closed_form exactly, with log-margins of 0.26 nats on both sides of the cut.

What intact sglang is predicted to do under MTP (docs/upstream/sglang-mtp-verify-penalty-state.md,
docs/upstream/sglang-mtp-verify-ignores-min-p.md, docs/upstream/sglang-mtp-verify-skips-custom-logit-processor.md):
  * penalties and min_new_tokens see one token per verify step: the penalizers are fed only the bonus token
    (0.5.13 ``frozen_kv_mtp_worker.py: FrozenKVMTPWorker.draft`` ``cumulate_output_tokens(spec_info.bonus_tokens)``;
    0.5.17 ``eagle_utils.py: eagle_prepare_for_decode`` -> ``schedule_batch.py:
    ScheduleBatch.cumulate_penalty_output_tokens``, the last output token) and one state is repeated over every
    row of the verify block (``orchestrator.py: apply(repeat=...)`` / ``eagle_sample``'s repeat_interleave). So
    ``min-new-tokens-released`` keeps the stop token masked through verify step 7 (the counter is the number of
    verify steps, 2 at the stop token) and runs past it, and ``repetition-boost`` forgets every accepted draft;
  * min_p is not applied in verify (top-k and top-p renormalisation only: 0.5.13 ``EagleVerifyInput.verify``,
    0.5.17 ``eagle_sample``): d4 comes back at ~9% of the verify-sampled tokens;
  * 0.5.17's and 0.5.23's verify apply no custom logit processor (``eagle_sample`` has no call; 0.5.13's verify
    calls ``apply_custom_logit_processor``): ``custom-logit-processor`` is the plain chain under MTP
    (docs/upstream/sglang-mtp-verify-skips-custom-logit-processor.md).
"""

from __future__ import annotations

from mtpmatrix.tiers.surface import logprobs, top_token_swap

NAME = "features"
WITNESS_PAIR = logprobs.PAIR
SAMPLED_PAIR = "sampled"
MAX_NEW_TOKENS = 32
TOP_N = 5  # top logprobs at every position: the no-MTP margin where an output diverges
BIAS_POSITION = 4  # 1-based output position biased away: verify step 1, accepted draft 3
BIAS = -100.0
CUSTOM = "custom-logit-processor"
SWAP_POSITION = BIAS_POSITION  # 1-based output position the processor changes: verify step 1, accepted draft 3
SWAP_SHIFT = 40  # ``instead`` = the swapped token + 40: past the chain's end, so the chain on from it never meets it
STOP_POSITION = 9  # 1-based position of the stop token: verify step 2, accepted draft 2
RELEASED_MIN_NEW = STOP_POSITION - 1  # 8 tokens precede the stop token: no-MTP emits it
BOOST_PENALTY = 0.1
MIN_P = 0.26
MIN_P_REQUESTS = 16
MIN_P_NEW_TOKENS = 64
MIN_P_SEED_BASE = 9_000

# label -> (prompt start, sampling params beyond temperature 0 / max_new_tokens), greedy on the witness
_STARTS = iter(range(60, 460, 40))
WITNESS_FEATURES = {
    "logit-bias": (next(_STARTS), {}),
    "min-new-tokens-masked": (next(_STARTS), {"min_new_tokens": MAX_NEW_TOKENS}),
    "min-new-tokens-released": (next(_STARTS), {"min_new_tokens": RELEASED_MIN_NEW}),
    "frequency-penalty-plus": (next(_STARTS), {"frequency_penalty": 2.0, "ignore_eos": True}),
    "frequency-penalty-minus": (next(_STARTS), {"frequency_penalty": -2.0, "ignore_eos": True}),
    "presence-penalty-plus": (next(_STARTS), {"presence_penalty": 2.0, "ignore_eos": True}),
    "presence-penalty-minus": (next(_STARTS), {"presence_penalty": -2.0, "ignore_eos": True}),
    "repetition-penalty-2": (next(_STARTS), {"repetition_penalty": 2.0, "ignore_eos": True}),
    "repetition-boost": (next(_STARTS), {"repetition_penalty": BOOST_PENALTY, "ignore_eos": True}),
    CUSTOM: (next(_STARTS), {"ignore_eos": True}),
}
# Sent alone (surface.split_alone): a penalizer's history is fed ``req.output_ids[-1]`` when the request's next batch
# is prepared (0.5.17 ``schedule_batch.py: ScheduleBatch.cumulate_penalty_output_tokens``, with and without MTP).
# The overlap scheduler prepares that batch before it processes the previous step's result, so the token fed is one
# step old; after another request's prefill batch ran in between, the result was processed first and the newest
# token is fed, then fed again at the next step, and the token before it never. Which tokens a penalty sees thus
# depends on when other requests arrive. Seen on the H200, 0.5.17: repetition-boost equal to no-MTP on every MTP
# server in one run (suite commit f46c5ed) and [392, 391, 391, ...] against [392, 391, 392, ...] on topk 3 and
# eager in the next (8cac82d, four more requests per witness server beside it). Alone, a request's steps follow
# each other on both servers, so the comparison sees what MTP does to penalties, not the arrival timing.
ALONE = frozenset(
    label for label, (_start, extra) in WITNESS_FEATURES.items() if any(k.endswith("_penalty") for k in extra)
)
# labels with no prediction past a point, held to no-MTP there: a divergence at a bf16 near-tie of the no-MTP
# server's own (processed) logprobs is no deviation: both tokens are argmaxes within kernel rounding. The bound is
# logprobs.TOLERANCE_NATS, scaled by how much the feature scales the logits there.
TIE_SCALE = {"logit-bias": 1.0, "repetition-boost": 1.0 / BOOST_PENALTY}


def witness_prompt(label: str) -> list[int]:
    return logprobs.chain_prompt(WITNESS_FEATURES[label][0])


def chain(label: str, n: int = MAX_NEW_TOKENS) -> list[int]:
    last = witness_prompt(label)[-1]
    return [last + k for k in range(1, n + 1)]


def swap_tokens() -> tuple[int, int]:
    """(token_id, instead) of the custom-logit-processor request: the chain's token at SWAP_POSITION, and the token
    the processor puts there."""
    swapped = chain(CUSTOM)[SWAP_POSITION - 1]
    return swapped, swapped + SWAP_SHIFT


def swapped_chain(n: int = MAX_NEW_TOKENS) -> list[int]:
    """The witness's greedy output with the processor: the chain up to SWAP_POSITION, then ``instead`` and its
    chain (next = token + 1 from any token)."""
    k = SWAP_POSITION - 1
    _token, instead = swap_tokens()
    return chain(CUSTOM)[:k] + [instead + i for i in range(n - k)]


def _witness_payload(label: str) -> dict:
    start, extra = WITNESS_FEATURES[label]
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, **extra}
    want = chain(label)
    if label == "logit-bias":
        params["logit_bias"] = {str(want[BIAS_POSITION - 1]): BIAS}
        params["ignore_eos"] = True
    if label.startswith("min-new-tokens"):
        params["stop_token_ids"] = [want[STOP_POSITION - 1]]  # ignore_eos stays off: it would ignore these too
    processor = {}
    if label == CUSTOM:
        params["custom_params"] = top_token_swap.custom_params(*swap_tokens())
        processor = {"custom_logit_processor": top_token_swap.serialised()}
    return {
        "input_ids": witness_prompt(label),
        "sampling_params": params,
        "return_logprob": True,
        "top_logprobs_num": TOP_N,
        **processor,
    }


def min_p_prompt(i: int) -> list[int]:
    from mtpmatrix.pairs.sampled import ring

    return [ring.RING_START + (7 * i + 5 * j) % ring.RING_SIZE for j in range(ring.PROMPT_LEN)]


def _min_p_payload(i: int) -> dict:
    from mtpmatrix.pairs.sampled import ring

    return {
        "input_ids": min_p_prompt(i),
        "sampling_params": {
            "temperature": ring.TEMPERATURE,
            "min_p": MIN_P,
            "max_new_tokens": MIN_P_NEW_TOKENS,
            "ignore_eos": True,
            "sampling_seed": MIN_P_SEED_BASE + i,
        },
    }


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair == WITNESS_PAIR:
        return [(label, _witness_payload(label)) for label in WITNESS_FEATURES]
    if spec.pair == SAMPLED_PAIR and not deterministic(spec):
        return [(f"min-p-{i}", _min_p_payload(i)) for i in range(MIN_P_REQUESTS)]
    return []


def deterministic(spec) -> bool:
    """A server under --enable-deterministic-inference gets no min_p request: sglang 0.5.17 then seeds every request
    and its torch sampler asserts that no seeded request asks for min_p, killing the scheduler (H200, 2026-12-02:
    docs/upstream/sglang-deterministic-min-p-crash.md); the other sampled servers test min_p."""
    return "--enable-deterministic-inference" in spec.mode_args


def min_p_kept_ratios() -> dict[int, float]:
    """Probability of each offset relative to d1's at the sampled pair's temperature (softcapped logits)."""
    import math

    from mtpmatrix.pairs.sampled import ring

    top = ring.softcap(ring.TARGET_LOGITS[0])
    return {d: math.exp((ring.softcap(x) - top) / ring.TEMPERATURE) for d, x in zip(ring.OFFSETS, ring.TARGET_LOGITS)}


def predicted(label: str, output: list[int], *, mtp_intact_sglang: bool = False) -> str | None:
    """What is wrong with ``output`` against the label's own prediction (None: as predicted, or no prediction).
    ``mtp_intact_sglang``: predict what intact sglang's MTP path gives instead of the correct answer (only where
    the source says they differ; used to label a failure as the known deviation)."""
    want = chain(label)
    if label == "logit-bias":
        k = BIAS_POSITION - 1
        if output[:k] != want[:k] or len(output) != MAX_NEW_TOKENS:
            return f"expected the chain {want[:k]} then {MAX_NEW_TOKENS - k} more tokens, got {output[: k + 2]}..."
        if want[k] in output:
            return f"biased token {want[k]} (logit_bias {BIAS}) was emitted at output {output.index(want[k]) + 1}"
        return None
    if label == CUSTOM:
        return _custom_processor_predicted(output, mtp_intact_sglang)
    if label == "min-new-tokens-masked":
        stop = want[STOP_POSITION - 1]
        if output[: STOP_POSITION - 1] != want[: STOP_POSITION - 1] or stop in output or len(output) != MAX_NEW_TOKENS:
            return (
                f"expected the chain's first {STOP_POSITION - 1} tokens, never the stop token {stop} "
                f"(min_new_tokens {MAX_NEW_TOKENS}), {MAX_NEW_TOKENS} tokens; got {len(output)}: {output[:12]}..."
            )
        return None
    if label == "min-new-tokens-released":
        stop = want[STOP_POSITION - 1]
        if mtp_intact_sglang:
            # the stop token stays masked (the counter is 2 verify steps, below 8): the chain's first tokens, the
            # row's best other token in its place, and the +1 chain from that one to the length limit
            tail = output[STOP_POSITION - 1 :]
            ok = (
                output[: STOP_POSITION - 1] == want[: STOP_POSITION - 1]
                and stop not in output
                and len(output) == MAX_NEW_TOKENS
                and all(b == (a + 1) % logprobs.VOCAB for a, b in zip(tail, tail[1:]))
            )
        else:
            ok = output == want[:STOP_POSITION]
        return (
            None
            if ok
            else (
                f"expected the chain up to the stop token {stop} at output {STOP_POSITION} "
                f"(min_new_tokens {RELEASED_MIN_NEW} tokens precede it), then the end; got "
                f"{len(output)} tokens: {output[:12]}{'...' if len(output) > 12 else ''}"
            )
        )
    if "penalty" in label:
        if output != want:
            first = next((i for i, (a, b) in enumerate(zip(output, want)) if a != b), min(len(output), len(want)))
            return (
                f"a penalty on earlier tokens cannot move the witness's peak (margin "
                f"{logprobs.PEAK - logprobs.RUNNER_UP - 2:.2f} nats): expected the chain, got {len(output)} "
                f"tokens leaving it at output {first + 1}: {output[first : first + 3]}"
            )
        return None
    return None  # repetition-boost: held to no-MTP only


def _custom_processor_predicted(output: list[int], mtp_intact_sglang: bool) -> str | None:
    """The custom-logit-processor request: the swapped chain; intact 0.5.17 / 0.5.23 MTP (no processor in verify):
    the plain chain. The message for the plain chain is the known-upstream entry's signature."""
    token, instead = swap_tokens()
    plain = chain(CUSTOM)
    if output == (plain if mtp_intact_sglang else swapped_chain()):
        return None
    if output == plain:
        return (
            f"the processor did not act: output is the unmodified chain, {token} at output {SWAP_POSITION} where "
            f"the processor puts {instead} (custom_params token_id {token}, instead {instead})"
        )
    k = SWAP_POSITION - 1
    return (
        f"expected the chain {plain[:k]}, then {instead} in place of {token} and the chain on from it, "
        f"{MAX_NEW_TOKENS} tokens; got {len(output)}: {output[: k + 3]}..."
    )


def repeats(output: list[int]) -> int:
    """Tokens of ``output`` that already occurred earlier in it."""
    return len(output) - len(set(output))


def divergence(label: str, got: list[int], ref_ex) -> str | None:
    """Why ``got`` (an MTP server's output) differs from the no-MTP exchange ``ref_ex``; None when equal or when
    the first difference is a bf16 near-tie of the no-MTP server's own logprobs (labels in TIE_SCALE only)."""
    ref = ref_ex.output_ids
    if got == ref:
        return None
    pos = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    ranked = logprobs.top_logprobs(ref_ex.meta)
    row = ranked[pos] if pos < len(ranked) and ranked[pos] else []
    lp = {tid: v for v, tid in row}
    gap = None
    if pos < len(got) and pos < len(ref) and ref[pos] in lp and got[pos] in lp:
        gap = lp[ref[pos]] - lp[got[pos]]
    bound = logprobs.TOLERANCE_NATS * TIE_SCALE.get(label, 0.0)
    where = logprobs.position_label(pos)
    if gap is not None and gap <= bound:
        # A near-tie may send MTP another way from there, never another law: under a static logit bias the witness's
        # next token is a function of the token before it, so each later token is the same step from its
        # predecessor as no-MTP's. (repetition-boost's next token depends on the counts of the whole history: it
        # is not followed past a near-tie, whose bound there is 1/BOOST_PENALTY of the bf16 one.)
        steps = [[(b - a) % logprobs.VOCAB for a, b in zip(ids[pos:], ids[pos + 1 :])] for ids in (got, ref)]
        biased = chain(label)[BIAS_POSITION - 1]
        reaches = any((got[pos] + k) % logprobs.VOCAB == biased for k in range(1, len(got) - pos))
        if label != "logit-bias" or reaches or steps[0] == steps[1]:
            return None  # (a +1 chain from MTP's token that reaches the biased token turns there: not followed)
        k = next((i for i, (a, b) in enumerate(zip(*steps)) if a != b), min(map(len, steps)))
        return (
            f"{label}: after a near-tie at {where} (MTP {got[pos]}, no-MTP {ref[pos]}, {gap:.3f} <= {bound:.3f} nats), "
            f"MTP leaves no-MTP's steps at {logprobs.position_label(pos + 1 + k)}: MTP {got[pos + k : pos + k + 3]}, "
            f"no-MTP {ref[pos + k : pos + k + 3]} ({len(got)} vs {len(ref)} tokens)"
        )
    return (
        f"{label}: output differs from no-MTP at {where}: MTP {got[pos : pos + 3]}, no-MTP {ref[pos : pos + 3]} "
        f"({len(got)} vs {len(ref)} tokens); no-MTP margin there "
        f"{f'n/a (MTP token not in its top {TOP_N})' if gap is None else f'{gap:.3f} nats'}"
        + (f" (near-tie bound {bound:.3f})" if label in TIE_SCALE else "")
    )
