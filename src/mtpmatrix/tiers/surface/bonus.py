"""Request family: the bonus token at T > 0, on the sampled pair's second region (mtpmatrix.pairs.sampled.bonus).

Every sampled server (with and without MTP) gets N_REQUESTS requests of NEW_TOKENS tokens whose prompts end at the
region's spread token. There the drafter drafts the target's five-token chains exactly, so with MTP every verify step
accepts all five drafts and its sixth token, the bonus token, lands on the spread token's successor: a draw from a
closed form over four chain starts at the request's temperature and top-k. Every 6th output token (positions 6, 12,
..., 378) is a bonus token: 63 per request, 504 per group, 1,008 per server. Without MTP the same positions are plain
sampling, held to the same closed form.

Two groups, alternating: ``bonus T0.6 k4`` (all four starts kept, law (0.586, 0.255, 0.111, 0.048)) and
``bonus T1.4 k3`` (top-k cuts the fourth start: law (0.457, 0.320, 0.224, 0)). top_p is 1 in both. Each request
carries its own sampling_seed (distinct from the plan's and mixed_sampling's).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpmatrix.pairs.sampled import bonus as pb
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled.ring import SamplingGroup

NAME = "bonus"

N_REQUESTS = 16
NEW_TOKENS = 384  # + PROMPT_LEN 12 inside the smoke servers' 512-token context
PROMPT_LEN = 12
SEED_BASE = 11_000  # distinct from ring.SEED_BASE (7000..) and mixed_sampling.SEED_BASE (9000..)


@dataclass(frozen=True)
class Planned:
    label: str
    prompt: tuple[int, ...]
    group: SamplingGroup
    seed: int
    new_tokens: int = NEW_TOKENS


def plan() -> list[Planned]:
    return [
        Planned(f"bonus:{i}", pb.prompt(i, PROMPT_LEN), pb.GROUPS[i % len(pb.GROUPS)], SEED_BASE + i)
        for i in range(N_REQUESTS)
    ]


def bonus_positions(new_tokens: int = NEW_TOKENS) -> int:
    """Bonus positions per request: 6, 12, ... below new_tokens."""
    return (new_tokens - 1) // (pb.STEPS + 1)


def payload(p: Planned) -> dict:
    return ring.body(p.prompt, p.group, p.new_tokens, p.seed)


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if getattr(spec, "pair", None) != "sampled":
        return []
    return [(p.label, payload(p)) for p in plan()]


def streams(exchanges) -> list[tuple[str, SamplingGroup, tuple[int, ...], list[int]]]:
    """(label, group, prompt, output ids) of every planned request that came back, for pairs.sampled.bonus."""
    planned = {p.label: p for p in plan()}
    return [
        (x.label, planned[x.label].group, planned[x.label].prompt, x.output_ids)
        for x in exchanges
        if x.label in planned
    ]


def full_steps(meta: dict, steps: int = pb.STEPS) -> tuple[int | None, int | None]:
    """(verify steps, verify steps that accepted all ``steps`` drafts) of one response: the histogram's last bin when
    the release writes it, else the tail rule's lower bound completion_tokens - 1 - steps * verify steps
    (meta_fields); (None, None) without spec fields (no MTP)."""
    v = meta.get("spec_verify_ct")
    if not isinstance(v, int):
        return None, None
    hist = meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram")
    if isinstance(hist, list) and len(hist) > steps:
        return v, int(hist[steps])
    n = meta.get("completion_tokens")
    return v, max(0, n - 1 - steps * v) if isinstance(n, int) else None
