"""The sampled pair's closed form and check (mtpmatrix.pairs.sampled): the false-alarm rate of the check at the
smoke tier's sample size, its power, and a CPU model of sglang's verify, correct and broken
(mtpmatrix.pairs.sampled.verify_model), that the check must pass and fail respectively."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from scipy import special
from scipy import stats as sps

from mtpmatrix.core import stats
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled import verify_model as model

VOCAB = model.VOCAB
N = ring.N_REQUESTS * ring.NEW_TOKENS
EXPECTED = ring.closed_form(VOCAB)
P = np.array([EXPECTED[d] for d in ring.KEPT_OFFSETS])


def test_closed_form_is_the_same_for_every_group_and_filter_order():
    assert abs(sum(EXPECTED.values()) - 1) < 1e-12
    assert list(EXPECTED) == list(ring.KEPT_OFFSETS)
    # the drafter ranks the target's least likely kept offset first
    assert max(zip(ring.DRAFT_LOGITS, ring.OFFSETS))[1] == ring.KEPT_OFFSETS[-1]
    for group in ring.GROUPS:
        for order in ("joint", "top_k_first"):
            d = ring.token_distribution(VOCAB, group, order)
            assert d[ring.OFFSETS[3]] == 0 and d["other"] == 0
            assert d["top_p_margin"] >= ring.BOUNDARY_MARGIN


def test_each_filter_binds_in_its_own_group():
    """Skipping top-k shows d4 in the top-k group only, skipping top-p in the top-p group only."""
    d4 = ring.OFFSETS[3]
    by_name = {g.name: g for g in ring.GROUPS}
    assert ring.token_distribution(VOCAB, by_name["top-k binds"], apply_top_k=False)[d4] > 0.05
    assert ring.token_distribution(VOCAB, by_name["top-p binds"], apply_top_k=False)[d4] == 0
    assert ring.token_distribution(VOCAB, by_name["top-p binds"], apply_top_p=False)[d4] > 0.05
    assert ring.token_distribution(VOCAB, by_name["top-k binds"], apply_top_p=False)[d4] == 0


def test_a_boundary_too_close_is_refused(monkeypatch):
    monkeypatch.setattr(ring, "GROUPS", (ring.SamplingGroup("bad", top_k=4, top_p=0.9),))
    with pytest.raises(ValueError, match="within"):
        ring.closed_form(VOCAB)


def test_head_values_are_exact_in_bf16():
    assert ring.check_exact(128) == 8.0
    with pytest.raises(ValueError, match="not exact"):
        ring.check_exact(96)  # sqrt(48) is not dyadic


def test_stats_match_scipy():
    for x, df in ((0.5, 1), (3.5, 2), (18.42, 2), (40.0, 5), (200.0, 3)):
        assert stats.chi2_sf(x, df) == pytest.approx(sps.chi2.sf(x, df), rel=1e-9)
    assert stats.chi2_isf(1e-4, 2) == pytest.approx(sps.chi2.isf(1e-4, 2), rel=1e-9)
    for nc in (1.0, 30.0, 300.0):
        assert stats.ncx2_sf(18.42, 2, nc) == pytest.approx(sps.ncx2.sf(18.42, 2, nc), rel=1e-6, abs=1e-12)
    counts = [4300, 2450, 1442]
    res = stats.pearson_chi2(counts, list(P))
    ref = sps.chisquare(counts, P * sum(counts))
    assert res.statistic == pytest.approx(ref.statistic) and res.p_value == pytest.approx(ref.pvalue)


def test_false_alarm_rate_exact_at_the_smoke_sample_size():
    """The multinomial probability of the rejection region {chi-square >= isf(1e-4)} at n = 8192, summed exactly over
    every count vector within 9 standard deviations (the rest has probability < 1e-17): the chi-square tail is what
    the check states."""
    crit = stats.chi2_isf(ring.ALPHA, 2)
    sd = np.sqrt(N * P * (1 - P))
    n1 = np.arange(int(N * P[0] - 9 * sd[0]), int(N * P[0] + 9 * sd[0]) + 1)[:, None]
    n2 = np.arange(int(N * P[1] - 9 * sd[1]), int(N * P[1] + 9 * sd[1]) + 1)[None, :]
    n3 = N - n1 - n2
    logpmf = (
        special.gammaln(N + 1)
        - special.gammaln(n1 + 1)
        - special.gammaln(n2 + 1)
        - special.gammaln(n3 + 1)
        + n1 * np.log(P[0])
        + n2 * np.log(P[1])
        + n3 * np.log(P[2])
    )
    pmf = np.exp(logpmf)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
    e = N * P
    stat = (n1 - e[0]) ** 2 / e[0] + (n2 - e[1]) ** 2 / e[1] + (n3 - e[2]) ** 2 / e[2]
    exact = pmf[stat >= crit].sum()
    print(f"exact false-alarm rate at n={N}: {exact:.3e} (nominal {ring.ALPHA:g})")
    assert 0.8 * ring.ALPHA < exact < 1.2 * ring.ALPHA


def test_p_values_are_uniform_under_the_null():
    """200,000 simulated null runs of the statistic at n = 8192: p-values uniform (KS), tails calibrated at 1e-2 and
    1e-3 within 4 binomial standard deviations."""
    rng = np.random.default_rng(20261201)
    counts = rng.multinomial(N, P, size=200_000)
    e = N * P
    stat = ((counts - e) ** 2 / e).sum(axis=1)
    pv = np.exp(-stat / 2)  # the df-2 tail, as stats.chi2_sf
    assert sps.kstest(pv, "uniform").pvalue > 1e-3
    for a in (1e-2, 1e-3):
        k = (pv < a).sum()
        assert abs(k - a * len(pv)) < 4 * math.sqrt(a * len(pv)), (a, k)


def test_power_at_the_detectable_deviation():
    """The smallest deviation the README states (detectable_tv) is detected with power >= 0.9: simulate the least
    detectable alternative at that TV (mass moved from d1 to d2 and d3 in proportion, the split closest to 1/2)."""
    tv = ring.detectable_tv(N, VOCAB)
    assert 0.02 < tv < 0.04
    q = P.copy()
    q[0] -= tv
    q[1:] += tv * P[1:] / P[1:].sum()
    rng = np.random.default_rng(7)
    counts = rng.multinomial(N, q, size=20_000)
    e = N * P
    stat = ((counts - e) ** 2 / e).sum(axis=1)
    power = (stat >= stats.chi2_isf(ring.ALPHA, 2)).mean()
    print(f"detectable TV {tv:.4f}: simulated power {power:.3f}")
    assert power >= 0.89


def test_check_counts_offsets_and_flags_tokens_off_the_kept_set():
    start = ring.RING_START + ring.RING_SIZE - 2  # the ring wraps
    out = [ring.next_token(start, 1), ring.next_token(ring.next_token(start, 1), 3)]
    counts, off, first = ring.count_offsets([[start]], [out])
    assert counts == {1: 1, 3: 1} and off == 0
    bad = out + [ring.next_token(out[-1], ring.OFFSETS[3]), 5]
    counts, off, first = ring.count_offsets([[start]], [bad])
    assert off == 2 and first == (0, 2, out[-1], bad[2])
    assert not ring.check_outputs([[start]], [bad], VOCAB).passed


def test_payload_carries_the_group_and_a_distinct_seed():
    plan = ring.request_plan()
    bodies = [ring.payload(r) for r in plan]
    assert len({b["sampling_params"]["sampling_seed"] for b in bodies}) == len(plan)
    assert {(b["sampling_params"]["top_k"], b["sampling_params"]["top_p"]) for b in bodies} == {
        (g.top_k, g.top_p) for g in ring.GROUPS
    }
    assert all(b["sampling_params"]["temperature"] != 1 for b in bodies)
    assert all(ring.RING_START <= t < ring.RING_START + ring.RING_SIZE for r in plan for t in r.prompt)


def test_reference_plan_has_the_smoke_sample_size():
    """The reference tier's check of transformers' sampling draws its 8192 offsets as 512 requests of 16 tokens (one
    generate call per group): the same n as the smoke tier, both groups alike and each group's prompts the smoke
    plan's (8 times over), so the pooled counts are the same Multinomial(N, closed form) under the null and the
    exact false-alarm rate (1.003e-4) and power (TV 0.030 at 0.9) above hold for it unchanged."""
    plan = ring.request_plan(ring.REFERENCE_REQUESTS, ring.REFERENCE_TOKENS)
    assert len(plan) * ring.REFERENCE_TOKENS == N == 8192
    assert all(r.new_tokens == ring.REFERENCE_TOKENS for r in plan)
    for group in ring.GROUPS:
        mine = [r for r in plan if r.group == group]
        assert len(mine) == len(plan) // len(ring.GROUPS)
        smoke = [r for r in ring.request_plan() if r.group == group]
        assert sorted(r.prompt for r in mine) == sorted(r.prompt for r in smoke for _ in range(8))
    assert {ring.ring_index(r.prompt[-1]) for r in plan} == set(range(ring.RING_SIZE))
    assert round(ring.detectable_tv(N, VOCAB), 3) == 0.030


@pytest.mark.parametrize("topk", [None, 1, 3])
def test_correct_verify_passes_with_uniform_p_values(topk):
    """The CPU model of sglang's normal sampler / tree verify with nothing broken: 40 simulated smoke runs pass
    and their p-values look uniform."""
    rate, pv = model.detection_rate(model.ServerModel(topk), replicates=40, seed=11)
    assert rate == 0
    assert sps.kstest(pv, "uniform").pvalue > 1e-3


# Which server sees which broken verify (a sibling-order bug needs siblings; the leftover mass of an unscaled residual
# draw falls on d1 at topk 3, where the residual is mostly d1 anyway, so topk 1 is the server for it).
DETECTED = [
    (topk, bug)
    for topk in (1, 3)
    for bug in model.BUGS
    if bug != "none"
    and not (topk == 1 and bug == "prob_acc_not_summed")
    and not (topk == 3 and bug == "residual_not_renormalised")
]


@pytest.mark.parametrize("topk,bug", DETECTED, ids=[f"topk{t}-{b}" for t, b in DETECTED])
def test_broken_verify_is_detected(topk, bug):
    rate, _ = model.detection_rate(model.ServerModel(topk, bug), replicates=10, seed=3)
    assert rate == 1.0, f"{bug} at topk {topk}: detected in {rate:.0%} of simulated runs"


def test_draft_tree_shapes():
    chain = model.draft_tree(1)
    assert [d for _, d in chain] == [ring.KEPT_OFFSETS[-1]] * 5
    tree = model.draft_tree(3)
    assert len(tree) == 11 and all(parent < i for i, (parent, _) in enumerate(tree))
    root_children = [d for parent, d in tree if parent == -1]
    assert len(root_children) > 1 and set(root_children) != set(ring.KEPT_OFFSETS)  # never the whole kept set


def test_verify_round_is_lossless_on_one_step():
    """Exact check of one verify's first token against p (no statistics): with coins enumerated on a fine grid."""
    g = ring.GROUPS[0]
    p = model.verify_probs(g, "none")
    tree = model.draft_tree(3)
    rng = random.Random(5)
    firsts = [model.verify_round(p, tree, "none", rng, 0)[0] for _ in range(40_000)]
    for d in ring.KEPT_OFFSETS:
        assert firsts.count(d) / len(firsts) == pytest.approx(p[d], abs=0.01)


def _smoke_check():
    """The smoke tier's check function itself (tests/tiers/test_smoke.py), called outside pytest's fixtures."""
    import importlib.util
    from pathlib import Path

    from mtpmatrix.core.paths import SUITE

    path = Path(__file__).parents[2] / SUITE / "test_smoke.py"
    spec = importlib.util.spec_from_file_location("smoke_tier_checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.test_sampled_distribution_matches_closed_form


@pytest.mark.parametrize("bug,topk", [("none", 1), ("temperature_ignored", 1), ("top_p_skipped", 3)])
def test_smoke_check_on_simulated_servers(tmp_path, bug, topk):
    """test_sampled_distribution_matches_closed_form on a server run whose sampled outputs come from the CPU verify
    model: passes when verify is right, fails 'mismatch' naming the deviation when it is broken."""
    from mtpmatrix.core import smoke_servers
    from mtpmatrix.core.kinds import CheckFailure
    from mtpmatrix.tiers import smoke

    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.pair == "sampled" and s.topk == topk)
    prompts, outputs = model.ServerModel(topk, bug).outputs(random.Random(99))
    run = smoke.SmokeRun(
        spec=spec,
        log_path=tmp_path / "server.log",
        vocab_size=VOCAB,
        server_info_after={},
        sampled_requests=ring.request_plan(),
        sampled_outputs=outputs,
    )
    assert [list(r.prompt) for r in run.sampled_requests] == [list(p) for p in prompts]
    props = {}
    check = _smoke_check()
    if bug == "none":
        check({spec.name: run}, spec.name, props.__setitem__)
        assert props["sampled_offsets"] == N and props["sampled_off_support"] == 0
        return
    with pytest.raises(CheckFailure) as err:
        check({spec.name: run}, spec.name, props.__setitem__)
    print(err.value)
    assert err.value.kind == "mismatch"


def test_the_trimmed_target_keeps_the_layers_the_assistant_reads():
    """trimmed_target keeps the last layer of each attention type: the K/V the assistant is fed (witness's
    physical_kv_layers binds the same ones), for the dense-31b sampled target that the assisted check runs."""
    from mtpmatrix.pairs.sampled import trimmed_target
    from mtpmatrix.pairs.tiny.configs import target_template
    from mtpmatrix.pairs.witness.layout import physical_kv_layers

    text = target_template("dense-31b", "sampled")["text_config"]
    kept = trimmed_target.kept_layers(text["layer_types"])
    assert kept == sorted(idx[-1] for idx in physical_kv_layers(text).values())
    assert [text["layer_types"][i] for i in kept] == ["sliding_attention", "full_attention"]
    assert len(kept) < text["num_hidden_layers"]


def test_a_trimmed_config_renumbers_the_per_layer_overrides():
    """transformers >= 5.19 keeps a full layer's head_dim / KV heads in ``per_layer_config`` by layer index: the
    trimmed config carries each kept layer's overrides to its new index and drops the others' (built again from the
    dict, as the layers' shapes are derived when a config is built)."""
    from mtpmatrix.pairs.sampled import trimmed_target
    from mtpmatrix.pairs.tiny.configs import target_template

    class Config:
        def __init__(self, data):
            self.data = data

        def to_dict(self):
            return json.loads(json.dumps(self.data))

        @classmethod
        def from_dict(cls, data):
            return cls(data)

    text = dict(target_template("dense-31b", "sampled")["text_config"])
    text["per_layer_config"] = {"2": {"head_dim": 64}, "5": {"head_dim": 64, "num_key_value_heads": 1}}
    original = Config({"text_config": text, "model_type": "gemma4"})
    kept = trimmed_target.kept_layers(text["layer_types"])
    lean = trimmed_target._renumbered_config(original, kept).data
    assert lean["model_type"] == "gemma4"
    assert lean["text_config"]["num_hidden_layers"] == 2
    assert lean["text_config"]["layer_types"] == ["sliding_attention", "full_attention"]
    assert lean["text_config"]["per_layer_config"] == {"1": {"head_dim": 64, "num_key_value_heads": 1}}
    assert original.data["text_config"]["num_hidden_layers"] == 6, "the target's own config is left alone"
