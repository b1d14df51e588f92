"""Request family "token_ids_logprob": logprobs of chosen token ids (``token_ids_logprob``, io_struct.py
GenerateReqInput, 0.5.13-0.5.23) on the witness servers, in a batch where every request asks (``LAST_FIRST``), then in
a batch mixed with a top-logprob request and a plain one (``MIXED``).

sglang returns meta_info["output_token_ids_logprobs"]: per output position, one (logprob, token id, text) per asked
id (tokenizer_manager.py: detokenize_top_logprobs_tokens), read from the same row as output_token_logprobs (under
MTP the verify row of that position: logprob.py add_output_logprobs_for_spec_v1 / compute_spec_v2_logprobs).

Witness rows (surface/logprobs.py): at output position k the row's peak is the output token itself, logprob >=
OWN_FLOOR (-0.216); every other id is <= -GAP (-7.66) there. Each asked id list holds chain tokens that are the
output at a prefill, an accepted-draft and a bonus position, and one id the chain never reaches, so every position
has exactly one asked id at the peak or none, predicted; values equal no-MTP's within logprobs.TOLERANCE_NATS.
"""

from __future__ import annotations

from mtpmatrix.tiers.surface import both_answered, logprobs, reference_gaps
from mtpmatrix.tiers.surface.logprobs import GAP, OWN_FLOOR, TOLERANCE_NATS, chain_prompt, position_label

NAME = "token_ids_logprob"
# sglang 0.5.17's overlap scheduler dies on this family's mixed batch (batch_result_processor._normalize_decode_outputs
# calls .tolist() on the [] a request that did not ask leaves; H200 2026-12-05,
# docs/runs/2026-12-05-h200-sglang-0.5.17-new-families-first-run.md; sglang issue #34719), the no-MTP server too: sent
# last, so the crash costs this family's checks, not every family after it on the server; and the requests that all
# ask go first, in a batch of their own (no request beside them leaves a []), so their values are proven either way.
LAST = True
MIXED_ASKING = 300  # the asking request of the mixed batch (its own chain: no radix hit on the first batch's)
MIXED = frozenset({f"mixed-{MIXED_ASKING}", "top-350", "plain-400"})
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
MAX_NEW_TOKENS = 32
PROMPT_LEN = 12
ASKING = (20, 130, 240)  # prompt starts (+1 chains, no wrap: start + 12 + 32 < 512)
LAST_FIRST = frozenset(f"ids-{s}" for s in ASKING)  # the batch in which every request asks
# output positions (0-based) whose token each asking request names: the prefill token, step 1 draft 3, step 2's
# bonus (output 12), step 3 draft 1; plus an id 100 past the chain
ASKED_POSITIONS = (0, 3, 12, 13)
NEVER = 100
TOP_N = 3


def asked_ids(start: int) -> list[int]:
    first = start + PROMPT_LEN  # output position 0's token
    return [first + k for k in ASKED_POSITIONS] + [first + MAX_NEW_TOKENS + NEVER]


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR:
        return []
    base = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    out = []
    for s in ASKING:
        out.append(
            (
                f"ids-{s}",
                {
                    "input_ids": chain_prompt(s),
                    "sampling_params": dict(base),
                    "return_logprob": True,
                    "token_ids_logprob": asked_ids(s),
                },
            )
        )
    # the mixed batch: an asking request, a top-logprob request and a plain one beside it
    out.append(
        (
            f"mixed-{MIXED_ASKING}",
            {
                "input_ids": chain_prompt(MIXED_ASKING),
                "sampling_params": dict(base),
                "return_logprob": True,
                "token_ids_logprob": asked_ids(MIXED_ASKING),
            },
        )
    )
    out.append(
        (
            "top-350",
            {
                "input_ids": chain_prompt(350),
                "sampling_params": dict(base),
                "return_logprob": True,
                "top_logprobs_num": TOP_N,
            },
        )
    )
    out.append(("plain-400", {"input_ids": chain_prompt(400), "sampling_params": dict(base)}))
    return out


def entries(ex) -> list[list[tuple[float, int]]]:
    return [[(e[0], int(e[1])) for e in pos or []] for pos in ex.meta.get("output_token_ids_logprobs") or []]


def own_problems(ex) -> list[str]:
    if ex.error:
        return [f"{ex.label}: request failed: {ex.error}"]
    asked = ex.payload.get("token_ids_logprob")
    prompt = ex.payload["input_ids"]
    want_out = [prompt[-1] + k for k in range(1, MAX_NEW_TOKENS + 1)]
    if ex.output_ids != want_out:
        return [f"{ex.label}: output leaves the +1 chain: {ex.output_ids[:6]}..."]
    if not asked:
        if ex.meta.get("output_token_ids_logprobs"):
            return [f"{ex.label}: output_token_ids_logprobs returned to a request that did not ask"]
        # the mixed batch's top-logprob request: its own logprobs held as the logprobs family holds them
        return logprobs.own_problems(ex) if ex.payload.get("top_logprobs_num") else []
    rows = entries(ex)
    if len(rows) != len(want_out):
        return [f"{ex.label}: {len(rows)} positions of output_token_ids_logprobs for {len(want_out)} output tokens"]
    out = []
    for k, (row, tok) in enumerate(zip(rows, want_out)):
        where = f"{ex.label} {position_label(k)}"
        if [t for _lp, t in row] != asked:
            out.append(f"{where}: ids {[t for _lp, t in row]}, asked {asked}")
            continue
        for lp, t in row:
            if t == tok and (lp is None or lp < OWN_FLOOR):
                out.append(f"{where}: the output token {t} (asked) has logprob {lp} < {OWN_FLOOR:.3f}")
            elif t != tok and (lp is None or lp > -GAP):
                out.append(f"{where}: asked id {t}, not the output {tok}, has logprob {lp} > {-GAP:.2f}")
    return out


def against_reference(exchanges, reference) -> list[str]:
    out = reference_gaps(exchanges, reference)
    for ex, r in both_answered(exchanges, reference):
        if not ex.payload.get("token_ids_logprob"):
            continue
        for k, (a, b) in enumerate(zip(entries(ex), entries(r))):
            worst = max((abs(x[0] - y[0]), x[1]) for x, y in zip(a, b)) if a and b else (0.0, None)
            if worst[0] > TOLERANCE_NATS:
                out.append(
                    f"{ex.label} {position_label(k)}: id {worst[1]} differs from no-MTP by {worst[0]:.3f} > "
                    f"{TOLERANCE_NATS:.3f} nats"
                )
        if len(entries(ex)) != len(entries(r)):
            out.append(f"{ex.label}: {len(entries(ex))} positions, no-MTP {len(entries(r))}")
    return out
