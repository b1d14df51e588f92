"""Request family "logprobs": ``return_logprob`` with ``top_logprobs_num`` and input logprobs on the witness servers,
held token by token to the witness without MTP and to the witness's own logits.

What sglang returns (read from the source):
  * no MTP: ``layers/sampler.py: Sampler.forward``: an all-greedy batch returns ``log_softmax(logits)``; a mixed
    batch ``log(softmax(logits / temperature))``; greedy requests carry temperature 1 (``sampling_params.py:
    SamplingParams.__init__`` turns temperature 0 into temperature 1, top_k 1), so both are the raw log-softmax for
    them, and the *processed* (temperature-scaled, not top-k-masked) one for sampled requests;
  * MTP, 0.5.13 (spec v1, ``frozen_kv_mtp_worker.py: FrozenKVMTPWorker.verify`` ->
    ``layers/utils/logprob.py: add_output_logprobs_for_spec_v1``): ``log_softmax(verify logits / temperature)`` on
    the verify rows of the accepted tokens (``res.accept_indices``), after verify added penalties and logit_bias
    in place (``eagle_info.py: EagleVerifyInput.verify``);
  * MTP, 0.5.17 (spec v2, ``eagle_worker_common.py`` -> ``layers/logprob_processor.py: compute_spec_v2_logprobs``):
    the same, ``log_softmax`` unscaled for an all-greedy batch, else divided by each request's temperature;
  * input logprobs (``logprob_start_len`` 0): the prefill of an MTP server is the target's own extend forward
    (0.5.13 ``FrozenKVMTPWorker.forward_target_extend``, 0.5.17 ``FrozenKVMTPWorkerV2.forward_batch_generation``
    extend branch, both through ``target_worker.forward_batch_generation``), so input logprobs come from the
    same LogitsProcessor as without MTP: nothing speculative touches them.
So an intact MTP server returns, per output token, the target's row at that token's own node: the same numbers the
no-MTP witness returns, up to bf16 kernel rounding.

The witness target (mtpmatrix.pairs.witness) makes each row a function of the row's input token x alone (its
hidden state is exactly sqrt(H) E[x]): raw logit of token j = LOGIT_PEAK * c(j).c(x+1), so after Gemma 4's final
softcap 30 tanh(l / 30) the peak (x + 1) is 17.48 and every other token at most softcap(20 (1 - code_margin)) = 9.82
(code_margin >= 0.49 on the tiny pairs, smoke.EXACT_PAIR_ACCEPT_LENGTH's comment). Hence:
  * the token read at the right node has logprob >= OWN_FLOOR = -log(1 + 511 exp(-7.66)) = -0.216 and rank 1;
  * any token read one node off (position off by one: the logprob of x + 1 in the row of x + 1 or x - 1) is not
    that row's peak: its logprob is <= -GAP = -7.66 nats.
Tolerance against no-MTP (TOLERANCE_NATS): the hidden state is the same bf16 vector in both servers, so the logits
differ only by kernel rounding: the lm_head GEMM's bf16 output (one ulp at |logit| in [16, 32): 0.125), the softcap
if done in bf16 (one more ulp: 0.125), and a one-ulp difference of the normed hidden state (relative 2^-8 of a
logit of 20: 0.078); a logprob is a logit minus the log-sum-exp, so at most twice that: 0.656 nats, an order of
magnitude below GAP. Sampled requests (temperature T, top_k 1: output still the argmax) scale it by 1/T.
"""

from __future__ import annotations

import math

NAME = "logprobs"
PAIR = "witness-sglang-phase"
TOP_N = 5  # top_logprobs_num: rank 1 and the runner-ups a neighbouring node would swap in
MAX_NEW_TOKENS = 32
PROMPT_LEN = 12
STEP_TOKENS = 6  # tokens a witness verify step keeps (settings.NUM_STEPS drafts + the bonus), topk 1 and 3 alike
SOFTCAP = 30.0  # the tiny pairs' final_logit_softcapping (tiny.configs.text_config)
LOGIT_PEAK = 20.0  # witness.weights.LOGIT_PEAK (kept here so the module imports without torch)
CODE_MARGIN = 0.49  # lower bound of witness.codes.code_margin on the tiny pairs
VOCAB = 512


def softcap(x: float) -> float:
    return SOFTCAP * math.tanh(x / SOFTCAP)


PEAK = softcap(LOGIT_PEAK)  # 17.48
RUNNER_UP = softcap(LOGIT_PEAK * (1.0 - CODE_MARGIN))  # 9.82: the largest any other token reaches
GAP = PEAK - RUNNER_UP  # 7.66 nats
OWN_FLOOR = -math.log1p((VOCAB - 1) * math.exp(-GAP))  # -0.216: the right node's own logprob is above it
BF16_ULP_16_32 = 2.0**-3  # bf16 spacing for |x| in [16, 32)
LOGIT_ERROR = BF16_ULP_16_32 + BF16_ULP_16_32 + 2.0**-8 * LOGIT_PEAK  # GEMM output, softcap, hidden: 0.328
TOLERANCE_NATS = 2 * LOGIT_ERROR  # 0.656: |logprob(MTP) - logprob(no MTP)| for one entry, temperature 1
SCALED_TEMPERATURE = 0.5
REFERENCE_SERVER = "witness-nomtp"


def chain_prompt(start: int, length: int = PROMPT_LEN) -> list[int]:
    """A prompt that is itself a +1 chain: every input logprob is read at a right node too."""
    return list(range(start, start + length))


# Prompt starts: ids from 16 up (no special token), the chain (prompt + 32 outputs) below 512 (no wrap). Each
# "input" request starts 20 ids after a "greedy" one, so its prompt rows (tokens start .. start + 10) are rows the
# greedy request also reads as outputs (tokens start - 9 .. start + 1 of it), accepted drafts and bonus alike.
GREEDY_STARTS = (40, 150, 260)
INPUT_STARTS = tuple(s + 20 for s in GREEDY_STARTS)
SCALED_STARTS = (370, 420)


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR:
        return []
    out = []
    for label, starts, extra in (
        ("greedy", GREEDY_STARTS, {"temperature": 0.0}),
        ("input", INPUT_STARTS, {"temperature": 0.0}),
        ("scaled", SCALED_STARTS, {"temperature": SCALED_TEMPERATURE, "top_k": 1}),
    ):
        for s in starts:
            out.append(
                (
                    f"{label}-{s}",
                    {
                        "input_ids": chain_prompt(s),
                        "sampling_params": {**extra, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
                        "return_logprob": True,
                        "top_logprobs_num": TOP_N,
                        "logprob_start_len": 0,
                    },
                )
            )
    return out


def temperature_of(payload: dict) -> float:
    t = payload["sampling_params"].get("temperature", 1.0)
    return 1.0 if t == 0 else t


def tolerance(payload: dict) -> float:
    return TOLERANCE_NATS / temperature_of(payload)


def position_label(i: int, step_tokens: int = STEP_TOKENS) -> str:
    """What output position ``i`` (0-based) is when every draft is accepted: the prefill token, then per verify step
    ``step_tokens - 1`` accepted drafts and the bonus."""
    if i == 0:
        return "output 0 (prefill token)"
    step, slot = divmod(i - 1, step_tokens)
    kind = "bonus" if slot == step_tokens - 1 else f"accepted draft {slot + 1}"
    return f"output {i} (verify step {step + 1}, {kind})"


def _pairs(entries) -> list[tuple[float | None, int]]:
    return [(e[0], int(e[1])) for e in entries or []]


def token_logprobs(meta: dict, key: str = "output_token_logprobs") -> list[tuple[float | None, int]]:
    return _pairs(meta.get(key))


def top_logprobs(meta: dict, key: str = "output_top_logprobs") -> list[list[tuple[float, int]] | None]:
    return [None if pos is None else _pairs(pos) for pos in meta.get(key) or []]


def own_problems(ex) -> list[str]:
    """What is wrong with one exchange on its own: outputs off the +1 chain, logprob token ids that are not the
    output ids, rank 1 that is not the output token, an own logprob below OWN_FLOOR (read at another node)."""
    if ex.error:
        return [f"{ex.label}: request failed: {ex.error}"]
    prompt = ex.payload["input_ids"]
    want = [prompt[-1] + k for k in range(1, MAX_NEW_TOKENS + 1)]
    out, meta = ex.output_ids, ex.meta
    if out != want:
        first = next((i for i, (a, b) in enumerate(zip(out, want)) if a != b), min(len(out), len(want)))
        return [
            f"{ex.label}: output ids leave the +1 chain at {position_label(first)}: got {out[first : first + 3]}, "
            f"expected {want[first : first + 3]} ({len(out)} tokens, {MAX_NEW_TOKENS} expected)"
        ]
    tok, top = token_logprobs(meta), top_logprobs(meta)
    if len(tok) != len(out) or len(top) != len(out):
        return [
            f"{ex.label}: {len(tok)} output_token_logprobs and {len(top)} output_top_logprobs for {len(out)} "
            f"output tokens"
        ]
    problems = []
    floor = OWN_FLOOR / temperature_of(ex.payload)
    asked = ex.payload.get("top_logprobs_num", TOP_N)
    for i, ((lp, tid), ranked, o) in enumerate(zip(tok, top, out)):
        where = f"{ex.label} {position_label(i)}"
        if ranked is not None and len(ranked) != asked:
            # sglang's LogitsProcessor takes topk(top_logprobs_num) of a 512-token row: exactly that many entries
            problems.append(f"{where}: {len(ranked)} top logprobs, {asked} asked (top_logprobs_num)")
        elif tid != o:
            problems.append(f"{where}: output_token_logprobs names token {tid}, the output is {o}")
        elif not ranked or ranked[0][1] != o:
            problems.append(f"{where}: top-1 logprob is token {ranked[0][1] if ranked else None}, the output is {o}")
        elif lp is None or lp < floor:
            problems.append(
                f"{where}: token {o} has logprob {lp}, below {floor:.3f} (the right node's own token is "
                f"the row's peak; a neighbouring node's reading is <= "
                f"{-GAP / temperature_of(ex.payload):.2f})"
            )
        elif abs(ranked[0][0] - lp) > 1e-6:
            problems.append(f"{where}: token logprob {lp} differs from its own top-1 logprob {ranked[0][0]}")
    return problems


def compare_rows(
    label: str, where: str, got: list[tuple[float, int]], ref: list[tuple[float, int]], tol: float
) -> str | None:
    """One position's top logprobs against the reference's: same rank-1 token, every token both list within
    ``tol`` nats. Runner-ups may swap between ranks 2..TOP_N (bf16 near-ties), so shared ids are compared by id, and
    an id only one side lists must be within ``tol`` of the other side's last listed logprob."""
    if not got or not ref:
        return f"{label} {where}: top logprobs missing (got {len(got or [])}, reference {len(ref or [])})"
    if got[0][1] != ref[0][1]:
        return f"{label} {where}: rank-1 token {got[0][1]} ({got[0][0]:.4f}), no-MTP {ref[0][1]} ({ref[0][0]:.4f})"
    ref_of = {tid: lp for lp, tid in ref}
    worst = max(((abs(lp - ref_of[tid]), tid, lp) for lp, tid in got if tid in ref_of), default=None)
    if worst and worst[0] > tol:
        d, tid, lp = worst
        return (
            f"{label} {where}: token {tid} logprob {lp:.4f}, no-MTP {ref_of[tid]:.4f}: differs by {d:.3f} > "
            f"{tol:.3f} nats (bf16 bound; a neighbouring node's reading is off by >= {GAP:.2f})"
        )
    # An id one side lists and the other does not fell just outside the other's top entries: within ``tol`` of the
    # other's last one (a bf16 near-tie at the cut), never above it by more; else the runner-ups are another row's.
    for mine, theirs, side in ((got, ref, "here"), (ref, got, "on no-MTP")):
        cut = min(lp for lp, _tid in theirs)
        other_ids = {tid for _lp, tid in theirs}
        stray = max(((lp, tid) for lp, tid in mine if tid not in other_ids), default=None)
        if stray and stray[0] > cut + tol:
            return (
                f"{label} {where}: token {stray[1]} is listed {side} at {stray[0]:.4f} and not on the other side, "
                f"whose last listed logprob is {cut:.4f} (beyond the {tol:.3f}-nat bf16 bound: other runner-ups)"
            )
    return None


def compare_exchange(ex, ref) -> list[str]:
    """Per output position of ``ex`` against the no-MTP exchange ``ref`` (same label)."""
    if ref.error:
        return [f"{ex.label}: the no-MTP reference request failed: {ref.error}"]
    got, want = top_logprobs(ex.meta), top_logprobs(ref.meta)
    tok, ref_tok = token_logprobs(ex.meta), token_logprobs(ref.meta)
    tol = tolerance(ex.payload)
    problems = []
    for i in range(max(len(got), len(want))):
        where = position_label(i)
        if i >= len(got) or i >= len(want):
            problems.append(f"{ex.label}: {len(got)} positions with logprobs, no-MTP {len(want)}")
            break
        why = compare_rows(ex.label, where, got[i], want[i], tol)
        if why is None and i < len(tok) and i < len(ref_tok) and None not in (tok[i][0], ref_tok[i][0]):
            d = abs(tok[i][0] - ref_tok[i][0])
            if d > tol:
                why = (
                    f"{ex.label} {where}: output token logprob {tok[i][0]:.4f}, no-MTP {ref_tok[i][0]:.4f}: "
                    f"differs by {d:.3f} > {tol:.3f} nats"
                )
        if why:
            problems.append(why)
    return problems


def input_problems(exchanges) -> list[str]:
    """Input logprobs (logprob_start_len 0) of every exchange: one entry per prompt token, the first without a
    value; each later one read at the right node (the prompt is a +1 chain: rank 1 is the token, logprob >=
    OWN_FLOOR); and each row equal, within the tolerance, to the output row another request of this server read
    for the same input token (a witness row depends on its input token alone): prefill against verify, no other
    server needed."""
    rows: dict[int, tuple[str, list]] = {}  # input token of a row -> (where, its top logprobs) from greedy outputs
    for ex in exchanges:
        if ex.error or temperature_of(ex.payload) != 1.0:
            continue
        prompt_last = ex.payload["input_ids"][-1]
        for i, ranked in enumerate(top_logprobs(ex.meta)):
            row_token = prompt_last + i  # the input of output position i's row
            if ranked:
                rows.setdefault(row_token, (f"{ex.label} {position_label(i)}", ranked))
    problems = []
    for ex in exchanges:
        if ex.error:
            problems.append(f"{ex.label}: request failed: {ex.error}")
            continue
        prompt = ex.payload["input_ids"]
        tok = token_logprobs(ex.meta, "input_token_logprobs")
        top = top_logprobs(ex.meta, "input_top_logprobs")
        if [t for _lp, t in tok] != prompt or len(top) != len(prompt):
            problems.append(
                f"{ex.label}: input logprobs cover tokens {[t for _lp, t in tok]} ({len(top)} top "
                f"rows), the prompt is {prompt}"
            )
            continue
        if tok[0][0] is not None:
            problems.append(f"{ex.label}: the first prompt token has input logprob {tok[0][0]} (nothing precedes it)")
        tol = tolerance(ex.payload)
        floor = OWN_FLOOR / temperature_of(ex.payload)
        for p in range(1, len(prompt)):
            lp, ranked = tok[p][0], top[p]
            where = f"{ex.label} input {p} (token {prompt[p]} after {prompt[p - 1]})"
            if not ranked or ranked[0][1] != prompt[p] or lp is None or lp < floor:
                problems.append(
                    f"{where}: logprob {lp}, rank 1 {ranked[0] if ranked else None}: the token is its "
                    f"row's peak, so rank 1 with logprob >= {floor:.3f}"
                )
                continue
            if temperature_of(ex.payload) == 1.0 and prompt[p - 1] in rows:
                src, out_row = rows[prompt[p - 1]]
                why = compare_rows(where, f"against {src}", out_row, ranked, tol)
                if why:
                    problems.append(why.replace("no-MTP", "prefill"))
    return problems
