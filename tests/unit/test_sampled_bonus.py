"""The sampled pair's second region and the bonus family (pairs.sampled.bonus, surface.bonus,
tests/tiers/test_smoke_bonus.py): the region's layout and exactness, the alignment of bonus tokens, the check's exact
false-alarm rate at the smoke sample size, its power against a bonus drawn greedily, from the drafter's law or at
temperature 1, and the tier check on simulated runs."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
from scipy import special

from mtpmatrix.core import settings, smoke_servers, stats
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.sampled import bonus as pb
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.tiny.configs import ASSISTANT_HIDDEN, TARGET_HIDDEN
from mtpmatrix.pairs.tiny.vocab import SPECIAL_TOKENS
from mtpmatrix.tiers import smoke, surface
from mtpmatrix.tiers.surface import bonus, features, mixed_sampling

VOCAB = 512
N_GROUP = bonus.N_REQUESTS // len(pb.GROUPS) * bonus.bonus_positions()  # bonus tokens per group and server
LAWS = [np.array(pb.spread_law(VOCAB, g)) for g in pb.GROUPS]


def test_region_layout_is_off_the_ring_the_specials_and_every_other_prompt():
    region = set(range(pb.R2_START, pb.R2_START + pb.R2_SIZE))
    assert pb.STEPS == settings.NUM_STEPS and pb.R2_SIZE == 21 and max(region) < VOCAB
    assert not region & set(range(ring.RING_START, ring.RING_START + ring.RING_SIZE))
    assert min(region) > max(SPECIAL_TOKENS.values())
    assert pb.DIM_BASE == 1 + ring.RING_SIZE and pb.dim(max(region)) < ASSISTANT_HIDDEN
    # the target depends on the last token only: no other request to a sampled server ends in the region
    others = [list(r.prompt) for r in ring.request_plan()] + [list(p.prompt) for p in mixed_sampling.plan()]
    others += [features.min_p_prompt(i) for i in range(features.MIN_P_REQUESTS)] + smoke.id_prompts(VOCAB)
    assert all(p[-1] not in region for p in others)
    assert max(t for p in smoke.id_prompts(VOCAB) for t in p) < pb.R2_START
    assert all(set(p.prompt) <= region and p.prompt[-1] == pb.SPREAD for p in bonus.plan())


def test_head_values_and_logits_are_exact_in_bf16():
    entries = pb.check_exact(ring.check_exact(TARGET_HIDDEN))
    assert set(entries) == {8.0, 3.1875, 3.125, 3.0625, 3.0}
    with pytest.raises(ValueError, match="not exact"):
        pb.check_exact(7.0)


def test_chains_are_certain_and_the_spread_law_is_a_closed_form():
    assert pb.chain_deviation_bound(VOCAB) < 3e-11  # T 1.5, before top-k
    assert pb.chain_deviation_bound(VOCAB) * bonus.N_REQUESTS * bonus.NEW_TOKENS < 2e-7
    assert max(g.temperature for g in (*pb.GROUPS, *mixed_sampling.GROUPS, *ring.GROUPS)) <= pb.MAX_TEMPERATURE
    a, b = (pb.spread_law(VOCAB, g) for g in pb.GROUPS)
    assert a == pytest.approx((0.5859, 0.2550, 0.1109, 0.0482), abs=1e-4) and b[3] == 0
    assert min(p for law in LAWS for p in law if p > 0) * N_GROUP > 20  # expected counts for the chi-square
    with pytest.raises(ValueError):
        pb.spread_law(VOCAB, ring.SamplingGroup("x", top_k=4, top_p=0.9))


def test_prompts_and_alignment():
    """Following the chains from a prompt, a token after SPREAD lands exactly at positions 0, 6, 12, ...: the first
    from prefill, the rest the sixth token of each verify step."""
    rng = random.Random(1)
    for p in bonus.plan():
        out = _sample(rng, p.prompt, p.new_tokens, np.array(pb.spread_law(VOCAB, p.group)))
        spread, dev = pb.read_stream(p.prompt[-1], out, pb.spread_law(VOCAB, p.group))
        assert dev is None and [pos for pos, _ in spread] == list(range(0, p.new_tokens, pb.STEPS + 1))
    assert bonus.bonus_positions() == 63 and len(bonus.plan()) * bonus.bonus_positions() == 1008


def test_requests_only_for_the_sampled_pair_within_budget():
    assert bonus.NAME in surface.FAMILIES
    assert bonus.requests(next(s for s in smoke_servers.SMOKE_SERVERS if s.pair != "sampled"), VOCAB) == []
    reqs = bonus.requests(next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "sampled-nomtp"), VOCAB)
    assert len(reqs) == 16 and all(len(b["input_ids"]) + b["sampling_params"]["max_new_tokens"] <= 512 for _, b in reqs)
    seeds = {b["sampling_params"]["sampling_seed"] for _, b in reqs}
    others = (
        {r.seed for r in ring.request_plan()}
        | {p.seed for p in mixed_sampling.plan()}
        | {features.MIN_P_SEED_BASE + i for i in range(features.MIN_P_REQUESTS)}
    )
    assert len(seeds) == 16 and not seeds & others
    # 6,144 tokens: 39% of the ring's 15,872 sampled tokens per server (plan, mixed sampling, min_p), but in 1,024
    # verify steps with MTP (6 tokens each), against the ring's > 10,000 (accept length < 1.5)
    tokens = sum(b["sampling_params"]["max_new_tokens"] for _, b in reqs)
    ring_tokens = (
        ring.N_REQUESTS * ring.NEW_TOKENS
        + 2 * mixed_sampling.N_PER_GROUP * mixed_sampling.NEW_TOKENS
        + features.MIN_P_REQUESTS * features.MIN_P_NEW_TOKENS
    )
    assert tokens <= 0.4 * ring_tokens and tokens / (pb.STEPS + 1) <= 0.1 * ring_tokens / 1.5


def test_false_alarm_rate_exact_at_the_smoke_sample_size():
    """P(chi-square summed over the two groups >= isf(P_THRESHOLD, df 5)) under the null at 504 tokens per group, exactly:
    group A's statistic over every count vector within 8 standard deviations (the rest < 1e-14), group B's likewise,
    the sum's tail by convolution: at most ALPHA, and not far below it."""
    crit = stats.chi2_isf(pb.P_THRESHOLD, 5)

    def table(p, n):
        kept = p[p > 0]
        sd = np.sqrt(n * kept * (1 - kept))
        axes = [np.arange(max(0, int(n * q - 8 * s)), int(n * q + 8 * s) + 1) for q, s in zip(kept[1:], sd[1:])]
        grid = np.meshgrid(*axes, indexing="ij")
        rest = n - sum(grid)
        ok = rest >= 0
        cells = [np.where(ok, rest, 0), *grid]
        logpmf = (
            special.gammaln(n + 1)
            - sum(special.gammaln(c + 1) for c in cells)
            + sum(c * np.log(q) for c, q in zip(cells, kept))
        )
        stat = sum((c - n * q) ** 2 / (n * q) for c, q in zip(cells, kept))
        return stat[ok].ravel(), np.exp(logpmf[ok]).ravel()

    sa, pa = table(LAWS[0], N_GROUP)
    sb, pbb = table(LAWS[1], N_GROUP)
    assert pa.sum() == pytest.approx(1, abs=1e-9) and pbb.sum() == pytest.approx(1, abs=1e-9)
    order = np.argsort(sa)
    sa, tail = sa[order], np.cumsum(pa[order][::-1])[::-1]
    idx = np.searchsorted(sa, crit - sb)
    exact = float((pbb * np.where(idx < len(tail), tail[np.minimum(idx, len(tail) - 1)], 0.0)).sum())
    print(f"exact false-alarm rate at {N_GROUP} per group: {exact:.3e} (nominal {pb.ALPHA:g})")
    assert 0.8 * pb.ALPHA < exact <= pb.ALPHA


FAULTS = {  # a law over the starts per group, instead of the spread law
    "greedy bonus": lambda g: (1.0, 0.0, 0.0, 0.0),
    "drafter's law": lambda g: pb.draft_spread_law(),
    "temperature 1": lambda g: pb.spread_law(VOCAB, g, temperature=1.0),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_power_against_each_fault(fault):
    """Each fault is detected with probability >= 0.99 at the smoke sample size: the noncentral chi-square (or the
    support test) and 2,000 simulated runs (off-support tokens fail outright, as in check_streams)."""
    q = FAULTS[fault]
    assert pb.power(VOCAB, N_GROUP, q) >= pb.POWER
    rng = np.random.default_rng(11)
    crit = stats.chi2_isf(pb.P_THRESHOLD, 5)
    reps, hits = 2000, 0
    draws = [rng.multinomial(N_GROUP, np.array(q(g)) / sum(q(g)), size=reps) for g in pb.GROUPS]
    stat = np.zeros(reps)
    off = np.zeros(reps, dtype=bool)
    for law, counts in zip(LAWS, draws):
        kept = law > 0
        off |= counts[:, ~kept].sum(axis=1) > 0
        e = N_GROUP * law[kept]
        stat += ((counts[:, kept] - e) ** 2 / e).sum(axis=1)
    hits = int((off | (stat >= crit)).sum())
    print(f"{fault}: simulated power {hits / reps:.4f}, asymptotic {pb.power(VOCAB, N_GROUP, q):.4f}")
    assert hits / reps >= 0.99


# ---------------------------------------------------------------------------------------------- simulated outputs


def _sample(rng, prompt, n, law, bonus_law=None):
    """n tokens from the target's law (the chains, the spread law at SPREAD); ``bonus_law`` replaces the spread law
    at positions >= 1 (a broken bonus)."""
    out, prev = [], prompt[-1]
    for pos in range(n):
        if prev == pb.SPREAD:
            p = law if bonus_law is None or pos == 0 else bonus_law
            tok = pb.STARTS[rng.choices(range(pb.N_STARTS), weights=p)[0]]
        else:
            tok = pb.SUCCESSOR[prev]
        out.append(tok)
        prev = tok
    return out


def _streams(seed, bug="none"):
    rng = random.Random(seed)
    out = []
    for p in bonus.plan():
        law = pb.spread_law(VOCAB, p.group)
        bl = (1.0, 0, 0, 0) if bug == "greedy" else pb.spread_law(VOCAB, p.group, 1.0) if bug == "t1" else None
        toks = _sample(rng, p.prompt, p.new_tokens, law, bl)
        if bug == "chain" and p.label == "bonus:5":
            toks[100] = pb.STARTS[0]
        out.append((p.label, p.group, p.prompt, toks))
    return out


def test_check_passes_the_null_and_fails_each_fault():
    ok = pb.check_streams(_streams(3), VOCAB)
    assert ok.passed and ok.n_bonus == 1008 and ok.n_first == 16 and ok.misaligned == 0 and ok.df == 5
    for bug in ("greedy", "t1"):
        res = pb.check_streams(_streams(3, bug), VOCAB)
        assert not res.passed and res.deviations == 0, bug
    res = pb.check_streams(_streams(3, "chain"), VOCAB)
    assert res.deviations == 1 and res.first_deviation[:2] == ("bonus:5", 100)


def _smoke_module():
    path = Path(__file__).parents[1] / "tiers" / "test_smoke_bonus.py"
    spec = importlib.util.spec_from_file_location("smoke_bonus_checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_run(tmp_path, name, bug="none", full=True):
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == name)
    bodies = dict(bonus.requests(spec, VOCAB))
    run = smoke.SmokeRun(spec=spec, log_path=tmp_path / "server.log", vocab_size=VOCAB)
    exchanges = []
    for label, _group, _prompt, toks in _streams(4, bug):
        meta = {"completion_tokens": len(toks)}
        if spec.topk:
            v = 64 if full else 70
            hist = [0] * (pb.STEPS + 1)
            hist[pb.STEPS] = 64 if full else 60
            meta |= {"spec_verify_ct": v, "spec_correct_drafts_histogram": hist}
        exchanges.append(surface.Exchange(label, bodies[label], {"output_ids": toks, "meta_info": meta}))
    run.surface = {bonus.NAME: exchanges}
    return run


@pytest.mark.parametrize(
    "name,bug,full,kind",
    [
        ("sampled-mtp-topk1", "none", True, None),
        ("sampled-nomtp", "none", True, None),
        ("sampled-mtp-topk3", "greedy", True, "mismatch"),
        ("sampled-mtp-topk1", "chain", True, "mismatch"),
        ("sampled-mtp-topk1", "none", False, "acceptance"),
    ],
)
def test_smoke_check_on_fake_runs(tmp_path, name, bug, full, kind):
    mod = _smoke_module()
    assert name in mod.SAMPLED
    run = _fake_run(tmp_path, name, bug, full)
    props: dict = {}
    fn = mod.test_bonus_tokens_match_closed_form
    if kind is None:
        fn({name: run}, name, props.__setitem__)
        assert props["bonus_positions"] == 1008
        assert props["bonus_all_drafts_accepted_steps"] == (16 * 64 if "mtp" in name and "nomtp" not in name else None)
        return
    with pytest.raises(CheckFailure) as err:
        fn({name: run}, name, props.__setitem__)
    print(err.value)
    assert err.value.kind == kind
    assert ("bonus:5" in str(err.value)) if bug == "chain" else True


def test_full_steps_reads_the_histogram_or_bounds_from_the_tail_rule():
    assert bonus.full_steps({"completion_tokens": 384}) == (None, None)
    assert bonus.full_steps(
        {"completion_tokens": 384, "spec_verify_ct": 64, "spec_correct_drafts_histogram": [0, 0, 0, 0, 0, 64]}
    ) == (64, 64)
    assert bonus.full_steps({"completion_tokens": 384, "spec_verify_ct": 64}) == (64, 63)
