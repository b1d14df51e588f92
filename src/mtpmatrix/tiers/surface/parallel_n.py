"""Request family "parallel_n": ``n`` > 1 (sampling_params.py ``n``, 0.5.13-0.5.23) on the witness servers.

sglang fans a request with n > 1 out into n requests (io_struct.py GenerateReqInput: parallel_sample_num; the
prompt is prefilled once and shared) and /generate answers a list of n results, each with its own output_ids and
meta_info (speculative fields included) and its own request id (meta_info["id"]: each child gets a fresh rid,
tokenizer_manager.py regenerate_rid; 0.5.17 l. 1811-1870). Greedy, every sample of a witness request is the +1 chain; each must
equal the witness without MTP's, and each sample's counters stand on their own (test_smoke's accounting checks
read every sample's meta_info: SmokeRun.all_meta). sglang's own OpenAI hidden-states test notes that n = 2 "breaks
in the adapter with a 400 for EAGLE" and runs EAGLE with n = 1 only (sgl-project/sglang
test/srt/openai_server/features/test_openai_server_hidden_states.py); here n > 1 goes through /generate.
"""

from __future__ import annotations

from mtpmatrix.serving.client import Call
from mtpmatrix.tiers.surface import both_answered, reference_gaps
from mtpmatrix.tiers.surface.logprobs import chain_prompt

NAME = "parallel_n"
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
MAX_NEW_TOKENS = 32
CASES = ((2, 70), (3, 180))  # (n, prompt start)


def requests(spec, vocab_size: int) -> list[tuple[str, Call]]:
    if spec.pair != PAIR:
        return []
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    return [
        (f"n{n}-{s}", Call("/generate", {"input_ids": chain_prompt(s), "sampling_params": {**params, "n": n}}))
        for n, s in CASES
    ]


def samples(ex) -> list[dict]:
    return list(ex.response.get("outputs") or [])


def own_problems(ex, vocab: int) -> list[str]:
    if ex.error:
        return [f"{ex.label}: request failed: {ex.error}"]
    n = ex.payload.body["sampling_params"]["n"]
    last = ex.payload.body["input_ids"][-1]
    want = [(last + k) % vocab for k in range(1, MAX_NEW_TOKENS + 1)]
    got = samples(ex)
    if len(got) != n:
        return [f"{ex.label}: {len(got)} samples for n={n}"]
    out = []
    rids = [(s.get("meta_info") or {}).get("id") for s in got]
    if None in rids or len(set(rids)) != n:
        out.append(f"{ex.label}: sample ids {rids}: not {n} requests of their own (one answer copied?)")
    for i, s in enumerate(got):
        output = list(s.get("output_ids") or [])
        if output != want:
            out.append(f"{ex.label} sample {i}: output {output[:6]}... leaves the +1 chain {want[:6]}...")
        tokens = (s.get("meta_info") or {}).get("completion_tokens")
        if tokens != MAX_NEW_TOKENS:
            out.append(f"{ex.label} sample {i}: completion_tokens {tokens}")
    return out


def against_reference(exchanges, reference) -> list[str]:
    out = reference_gaps(exchanges, reference)
    for x, r in both_answered(exchanges, reference):
        mine = [s.get("output_ids") for s in samples(x)]
        theirs = [s.get("output_ids") for s in samples(r)]
        if mine != theirs:
            out.append(f"{x.label}: samples' output_ids differ from no-MTP's")
    return out
