"""Request family: mixed sampling in one batch on the sampled pair (mtpmatrix.pairs.sampled).

The sampled plan's two groups share one closed form by construction, so a verify that applies one request's
temperature / top-k / top-p to another request's rows is invisible there, and greedy requests on the sampled servers
were only length-checked. This family sends, in the same batch as the plan (same scheduler, same verify batches):

  * ``hot``  T 1.5, top_k 4, top_p 1: all four offsets kept, law ~(0.350, 0.272, 0.212, 0.165);
  * ``cold`` T 0.35, top_k 3, top_p 1: d1..d3 kept, law ~(0.684, 0.235, 0.081);
  * ``greedy`` temperature 0: the greedy chain of the pair, offset d1 = 1 at every step, exactly (d1's logit is
    0.375 above d2's: no bf16 tie; sglang turns temperature 0 into top_k 1 at temperature 1 when the request's
    SamplingParams is built, sampling_params.py __init__ in 0.5.13, __post_init__ in 0.5.17, so in a batch with
    sampled requests it goes through the sampling verify with a one-token target law, and any other request's
    parameters on its rows show as an off-chain token);
  * ``repeat`` copies of the first REPEATS hot requests: same prompt, same sampling_seed, in flight together. With
    --enable-deterministic-inference the copy must equal its original token for token (test_seeded_repeats_identical);
    the copies never enter the distribution tests (under determinism they are the same draw).

Each sampled group is held to its own closed form (pairs.sampled.structure), beside the plan's groups at T 0.7. All
top-p values are 1 (no top-p boundary to sit near); top-k never falls on a tie (token_distribution raises).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled.ring import SamplingGroup

NAME = "mixed_sampling"

HOT = SamplingGroup("hot T1.5 k4", top_k=4, top_p=1.0, temperature=1.5)
COLD = SamplingGroup("cold T0.35 k3", top_k=3, top_p=1.0, temperature=0.35)
GROUPS = (HOT, COLD)
# Sample size: 24 requests of 128 tokens per group (3072 offsets each); greedy 8 x 64 tokens; 4 repeats of 128.
# 7168 tokens and 60 requests in all: under the ~2x budget of the plan's 8192 tokens / 64 requests per server.
N_PER_GROUP = 24
NEW_TOKENS = ring.NEW_TOKENS
N_GREEDY = 8
GREEDY_TOKENS = 64
REPEATS = 4
SEED_BASE = 9_000  # distinct from the plan's ring.SEED_BASE + i (7000..7063)
GREEDY_OFFSET = ring.OFFSETS[0]  # the target's argmax offset at every step


@dataclass(frozen=True)
class Planned:
    label: str  # "<kind>:<index>", kind in hot / cold / greedy / repeat
    kind: str
    prompt: tuple[int, ...]
    group: SamplingGroup | None  # None: greedy
    seed: int | None
    new_tokens: int
    repeat_of: str | None = None  # the label of the request a repeat copies


def _prompt(i: int) -> tuple[int, ...]:
    # ring prompts whose last tokens cover the ring (as ring.request_plan), shifted off the plan's own
    return tuple(ring.RING_START + (7 * i + 5 * j + 1) % ring.RING_SIZE for j in range(ring.PROMPT_LEN))


def plan() -> list[Planned]:
    out: list[Planned] = []
    k = 0
    for kind, group in (("hot", HOT), ("cold", COLD)):
        for i in range(N_PER_GROUP):
            out.append(Planned(f"{kind}:{i}", kind, _prompt(k), group, SEED_BASE + k, NEW_TOKENS))
            k += 1
    for i in range(N_GREEDY):
        out.append(Planned(f"greedy:{i}", "greedy", _prompt(k), None, None, GREEDY_TOKENS))
        k += 1
    for i in range(REPEATS):
        src = out[i]  # hot:i
        out.append(Planned(f"repeat:{i}", "repeat", src.prompt, src.group, src.seed, src.new_tokens, src.label))
    return out


def payload(p: Planned) -> dict:
    if p.group is None:
        return {
            "input_ids": list(p.prompt),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": p.new_tokens, "ignore_eos": True},
        }
    return ring.body(p.prompt, p.group, p.new_tokens, p.seed)


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if getattr(spec, "pair", None) != "sampled":
        return []
    return [(p.label, payload(p)) for p in plan()]


# ---------------------------------------------------------------------------------------------- reading back


def planned_by_label() -> dict[str, Planned]:
    return {p.label: p for p in plan()}


def greedy_chain(prompt, n: int) -> list[int]:
    out, tok = [], prompt[-1]
    for _ in range(n):
        tok = ring.next_token(tok, GREEDY_OFFSET)
        out.append(tok)
    return out


def greedy_problems(exchanges) -> tuple[list[str], int]:
    """(what is wrong, requests checked) for the greedy requests: each output must be the greedy chain exactly."""
    planned = planned_by_label()
    bad, n = [], 0
    for x in exchanges:
        p = planned.get(x.label)
        if p is None or p.kind != "greedy":
            continue
        n += 1
        if x.error:
            bad.append(f"{x.label}: request failed: {x.error}")
            continue
        want, got = greedy_chain(p.prompt, p.new_tokens), x.output_ids
        if got != want:
            pos = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            prev = p.prompt[-1] if pos == 0 else want[pos - 1]
            tok = got[pos] if pos < len(got) else None
            bad.append(
                f"{x.label} (prompt ends {p.prompt[-1]}): {len(got)} tokens for {len(want)}, first wrong at "
                f"position {pos}: {prev} -> {tok} (offset {ring.offset_of(prev, tok) if tok else None}), "
                f"greedy chain {want[pos] if pos < len(want) else None} (offset {GREEDY_OFFSET})"
            )
    return bad, n


def repeat_pairs(exchanges) -> list[tuple]:
    """(original exchange, repeat exchange) for every repeat copy."""
    by_label = {x.label: x for x in exchanges}
    planned = planned_by_label()
    return [
        (by_label.get(planned[x.label].repeat_of), x)
        for x in exchanges
        if x.label in planned and planned[x.label].kind == "repeat"
    ]


def sampled_streams(exchanges) -> list[tuple[Planned, list[int]]]:
    """(planned, output ids) of the hot and cold requests (not the repeats): the family's distribution sample."""
    planned = planned_by_label()
    return [
        (planned[x.label], x.output_ids)
        for x in exchanges
        if x.label in planned and planned[x.label].kind in ("hot", "cold")
    ]
