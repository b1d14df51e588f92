"""Mixed sampling in one batch, the structure tests and seeded repeats (surface.mixed_sampling,
pairs.sampled.structure, tests/tiers/test_smoke_sampling.py): the false-alarm rate of the structure family on
simulated null runs of the full request plan, each test's power against the fault it targets (where the pooled
chi-square of pairs.sampled is blind), and the smoke checks themselves on correct and broken fake runs."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled import structure as st
from mtpmatrix.pairs.sampled import verify_model as model
from mtpmatrix.tiers import smoke, surface
from mtpmatrix.tiers.surface import mixed_sampling as ms

VOCAB = 512
PLAN = ring.request_plan()
FAMILY = [p for p in ms.plan() if p.kind in ("hot", "cold")]
# (group, length) of every request the structure tests count: the plan's 64 and the family's 48
REQUESTS = [(r.group, r.new_tokens) for r in PLAN] + [(p.group, p.new_tokens) for p in FAMILY]
LAW = {g: np.array(st.group_law(VOCAB, g)) for g in {g for g, _ in REQUESTS}}
V = np.array([1.0, -1.0, 0.0, 0.0])  # moves mass between d1 and d2: total variation delta per unit


def draw(rng, law, size):
    return rng.choice(len(law), size=size, p=law)


def simulate(rng, fault: str = "none", delta: float = 0.0):
    """Offset categories of every counted request, i.i.d. with each group's law unless ``fault``."""
    items = []
    for g, n in REQUESTS:
        p = LAW[g]
        if fault == "alternating":  # even positions +delta, odd -delta: the pooled marginal is exactly p
            cat = np.where(np.arange(n) % 2 == 0, draw(rng, p + delta * V, n), draw(rng, p - delta * V, n))
        elif fault == "drift":  # first half +delta, second half -delta
            cat = np.where(np.arange(n) < n // 2, draw(rng, p + delta * V, n), draw(rng, p - delta * V, n))
        elif fault == "sticky":  # repeat the previous offset with probability delta: stationary law exactly p
            cat = draw(rng, p, n)
            stay = rng.random(n) < delta
            for j in range(1, n):
                if stay[j]:
                    cat[j] = cat[j - 1]
        elif fault == "groups_opposite" and g in ring.GROUPS:  # the plan's two groups, opposite biases
            cat = draw(rng, p + (delta if g is ring.GROUPS[0] else -delta) * V, n)
        elif fault == "first_greedy":  # every request's first token at the argmax
            cat = draw(rng, p, n)
            cat[0] = 0
        elif fault == "cross_row_temperature" and g is ms.HOT:  # hot rows sampled at the plan's temperature 0.7
            q = st.group_law(VOCAB, ring.SamplingGroup("x", ms.HOT.top_k, ms.HOT.top_p, ring.TEMPERATURE))
            cat = draw(rng, np.array(q), n)
        else:
            cat = draw(rng, p, n)
        items.append((g, cat))
    return items


def pooled_plan_rejects(items) -> bool:
    """The existing pooled chi-square (pairs.sampled.ring.check_outputs) on the plan's tokens."""
    counts = np.zeros(4)
    for _g, cat in items[: len(PLAN)]:
        counts += np.bincount(cat, minlength=4)
    from mtpmatrix.core import stats

    p = [LAW[ring.GROUPS[0]][i] for i in range(3)]
    return stats.pearson_chi2(list(counts[:3]), p).p_value < ring.ALPHA or counts[3] > 0


def detection(fault, delta, reps, seed, test=None):
    rng = np.random.default_rng(seed)
    hits, pooled = 0, 0
    for _ in range(reps):
        items = simulate(rng, fault, delta)
        check = st.check_categories(items, VOCAB)
        hits += (not check.passed) if test is None else any(t.name == test for t in check.failed)
        pooled += pooled_plan_rejects(items)
    return hits / reps, pooled / reps


# ---------------------------------------------------------------------------------------------- the family


def test_groups_have_different_closed_forms_and_greedy_is_exact():
    forms = [st.group_law(VOCAB, g) for g in (ring.GROUPS[0], ms.HOT, ms.COLD)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert 0.5 * sum(abs(x - y) for x, y in zip(forms[a], forms[b])) > 0.1
    assert max(range(4), key=lambda i: forms[0][i]) == 0 and ms.GREEDY_OFFSET == ring.OFFSETS[0]
    assert ring.TARGET_LOGITS[0] - ring.TARGET_LOGITS[1] == 0.375  # the argmax margin, exact in bf16


def test_requests_only_for_the_sampled_pair_within_budget():
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "sampled-mtp-topk1")
    assert ms.requests(next(s for s in smoke_servers.SMOKE_SERVERS if s.pair != "sampled"), VOCAB) == []
    reqs = ms.requests(spec, VOCAB)
    assert ms.NAME in surface.FAMILIES and len(reqs) == len(ms.plan()) == 60
    tokens = sum(b["sampling_params"]["max_new_tokens"] for _, b in reqs)
    assert tokens <= 2 * ring.N_REQUESTS * ring.NEW_TOKENS - tokens  # under ~2x today's sampled tokens
    assert all(len(b["input_ids"]) + b["sampling_params"]["max_new_tokens"] <= 512 for _, b in reqs)
    seeds = [
        b["sampling_params"].get("sampling_seed") for label, b in reqs if not label.startswith(("greedy", "repeat"))
    ]
    assert len(set(seeds)) == len(seeds) and not set(seeds) & {r.seed for r in PLAN}
    bodies = dict(reqs)
    for i in range(ms.REPEATS):
        assert bodies[f"repeat:{i}"] == bodies[f"hot:{i}"]
    assert all(bodies[f"greedy:{i}"]["sampling_params"]["temperature"] == 0 for i in range(ms.N_GREEDY))


def _exchanges(outputs: dict[str, list[int]]):
    bodies = dict(ms.requests(next(s for s in smoke_servers.SMOKE_SERVERS if s.pair == "sampled"), VOCAB))
    return [surface.Exchange(label, bodies[label], {"output_ids": out}) for label, out in outputs.items()]


def _family_outputs(rng: random.Random, bug: str = "none"):
    """Outputs of the whole family: sampled groups from the CPU verify model at topk 1, greedy on the chain."""
    outs = {}
    tree = model.draft_tree(1)
    for p in ms.plan():
        if p.kind == "greedy":
            outs[p.label] = ms.greedy_chain(p.prompt, p.new_tokens)
            continue
        if p.kind == "repeat":
            outs[p.label] = list(outs[p.repeat_of])
            continue
        probs = model.verify_probs(p.group, "none")
        tok, out = p.prompt[-1], []
        while len(out) < p.new_tokens:
            for d in model.verify_round(probs, tree, "none", rng, ring.ring_index(tok)):
                tok = ring.next_token(tok, d)
                out.append(tok)
        outs[p.label] = out[: p.new_tokens]
    if bug == "greedy_row_sampled":  # a greedy request's verify row read with a sampled neighbour's parameters
        out = outs["greedy:3"]
        out[10] = ring.next_token(out[9], ring.OFFSETS[1])
        outs["greedy:3"] = out[:11] + ms.greedy_chain([out[10]], len(out) - 11)
    if bug == "repeat_differs":
        outs["repeat:2"] = outs["repeat:2"][:40] + [ring.next_token(outs["repeat:2"][39], 12)] * 88
    return outs


def test_greedy_problems_pass_on_the_chain_and_name_the_first_wrong_token():
    bad, n = ms.greedy_problems(_exchanges(_family_outputs(random.Random(1))))
    assert (bad, n) == ([], ms.N_GREEDY)
    bad, n = ms.greedy_problems(_exchanges(_family_outputs(random.Random(1), "greedy_row_sampled")))
    assert len(bad) == 1 and "greedy:3" in bad[0] and "position 10" in bad[0] and "offset 3" in bad[0]
    short = _family_outputs(random.Random(1))
    short["greedy:0"] = short["greedy:0"][:20]
    bad, _ = ms.greedy_problems(_exchanges(short))
    assert "20 tokens for 64" in bad[0]


# ---------------------------------------------------------------------------------------------- null and power


def test_exact_first_token_p_value_matches_simulation():
    law = st.group_law(VOCAB, ms.COLD)
    rng = np.random.default_rng(3)
    counts = rng.multinomial(24, law, size=20_000)
    ps = np.array([st.exact_chi2_p(c, law) for c in counts[:4000]])
    for a in (0.05, 0.01):  # exact: P(p <= a) <= a (discrete, conservative)
        assert (ps <= a).mean() <= a + 3 * np.sqrt(a / len(ps))
    assert st.exact_chi2_p([24, 0, 0, 0], law) < 0.01  # every first token at the argmax (cold: 0.684 ** 24)
    # a plan group (32 first tokens), Bonferroni over 4 groups
    assert st.exact_chi2_p([32, 0, 0, 0], st.group_law(VOCAB, ring.GROUPS[0])) < st.TEST_ALPHA / 4


def test_false_alarm_rate_on_null_runs():
    """1000 simulated null runs of the full plan (112 requests, 14336 offsets): each test's p-values are calibrated
    (share below 0.01 and 0.001 within 4 binomial sd of nominal, the chi-square tail at these strata), and the whole
    family (each test at 1e-4 / 6) never rejects; expected 0.1 false alarms in 1000 at the stated 1e-4."""
    rng = np.random.default_rng(20261202)
    reps = 1000
    pv = {name: [] for name in st.TESTS}
    family = 0
    for _ in range(reps):
        check = st.check_categories(simulate(rng), VOCAB)
        family += not check.passed
        for t in check.tests:
            pv[t.name].append(t.p_value)
    for name, ps in pv.items():
        ps = np.array(ps)
        for a in (1e-2, 1e-3):
            k = (ps < a).sum()
            assert k <= a * reps + 4 * np.sqrt(a * reps) + 1, (name, a, k)
        print(f"{name}: share p<0.01 {(ps < 0.01).mean():.3f}, p<0.05 {(ps < 0.05).mean():.3f}")
    assert family == 0


@pytest.mark.parametrize("topk", [1, 3])
def test_correct_verify_model_passes(topk):
    """The CPU model of sglang's verify, nothing broken, through the family's and the plan's requests."""
    rng = random.Random(40 + topk)
    prompts, outputs = model.ServerModel(topk).outputs(rng)
    streams = [(f"plan:{i}", r.group, r.prompt, out) for i, (r, out) in enumerate(zip(PLAN, outputs))]
    outs = _family_outputs(rng)
    streams += [(p.label, p.group, p.prompt, outs[p.label]) for p in FAMILY]
    check = st.check_streams(streams, VOCAB)
    assert check.passed, check.summary()
    assert check.n == sum(n for _, n in REQUESTS)


# Each fault: the test aimed at it, the size used, the simulated power of that test (>= 0.9 asserted) and of the
# pooled plan check (printed: the weakness the new test removes).
FAULTS = [
    # Sizes: the smallest of a 0.01 grid with simulated power >= 0.9 (60 runs each: alternating 0.82 at 0.03, 1.0 at
    # 0.04; drift 0.63 / 1.0 at 0.03 / 0.04; sticky 0.65 / 0.98 at 0.04 / 0.05; opposite 0.72 / 1.0 at 0.03 / 0.04);
    # the pooled check detects none of them (0.00 at every size).
    ("alternating", 0.04, "period6"),  # per-position bias cancelling when pooled: TV 0.04 at every position
    ("drift", 0.04, "position"),  # first half vs second half
    ("sticky", 0.05, "transition"),  # serial correlation, exact marginals: repeat the previous offset w.p. 0.05
    ("groups_opposite", 0.04, "group"),  # the plan's two groups biased oppositely
    ("first_greedy", 0.0, "first"),  # a wrong first token in every request
    ("cross_row_temperature", 0.0, "group"),  # the hot group's rows at another request's temperature
]


@pytest.mark.parametrize("fault,delta,test", FAULTS, ids=[f[0] for f in FAULTS])
def test_power_against_each_fault(fault, delta, test):
    power, pooled = detection(fault, delta, reps=100, seed=hash(fault) % 1000)
    aimed, _ = detection(fault, delta, reps=100, seed=7, test=test)
    print(
        f"{fault} (size {delta}): structure family {power:.2f}, {test} alone {aimed:.2f}, pooled plan check "
        f"{pooled:.2f}"
    )
    assert power >= 0.9 and aimed >= 0.9


def chain_verify(p_rows, rng: random.Random) -> list[int]:
    """One topk-1 verify step (drafts d3 x 5) with the target row of depth k read from ``p_rows[k]`` (k = 0..5)."""
    d3, out = ring.KEPT_OFFSETS[-1], []
    for k in range(5):
        u = rng.random()
        if u <= p_rows[k][d3]:
            out.append(d3)
            continue
        res = list(p_rows[k])
        res[d3] = 0.0
        return out + [rng.choices(range(len(res)), weights=res)[0]]
    return out + [rng.choices(range(len(p_rows[5])), weights=p_rows[5])[0]]


def test_depth_detects_rows_of_another_request_at_depth_one_and_more():
    """The repeat-instead-of-interleave class of bug: verify rows of depth >= 1 read with another request's
    temperature / top-k (here every plan row at depth >= 1 gets the hot group's law, hot rows the plan's). Simulated
    through the topk-1 chain; the depth test (and the family) catch it in every run, the pooled plan check in few."""
    law = {g: model.verify_probs(g, "none") for g in (*ring.GROUPS, ms.HOT, ms.COLD)}
    other = {g: law[ms.HOT] for g in ring.GROUPS} | {ms.HOT: law[ring.GROUPS[0]], ms.COLD: law[ms.COLD]}
    rng = random.Random(17)
    depth_hits, pooled_hits, reps = 0, 0, 5
    for _ in range(reps):
        items = []
        for g, n in REQUESTS:
            rows = [law[g]] + [other[g]] * 5
            offs = [model.normal_sample(law[g], rng)]  # prefill
            while len(offs) < n:
                offs += chain_verify(rows, rng)
            items.append((g, np.array([ring.OFFSETS.index(d) for d in offs[:n]])))
        check = st.check_categories(items, VOCAB)
        depth_hits += any(t.name == "depth" for t in check.failed)
        pooled_hits += pooled_plan_rejects(items)
    print(f"rows of another request at depth >= 1: depth test {depth_hits}/{reps}, pooled {pooled_hits}/{reps}")
    assert depth_hits == reps


def _smoke_module():
    path = Path(__file__).parents[1] / "tiers" / "test_smoke_sampling.py"
    spec = importlib.util.spec_from_file_location("smoke_sampling_checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_run(tmp_path, name, bug="none", deterministic=True, plan_bug="none"):
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == name)
    rng = random.Random(5)
    _prompts, outputs = model.ServerModel(spec.topk, plan_bug).outputs(rng)
    outs = _family_outputs(rng, bug)
    run = smoke.SmokeRun(
        spec=spec,
        log_path=tmp_path / "server.log",
        vocab_size=VOCAB,
        server_info_after={"enable_deterministic_inference": deterministic},
        sampled_requests=PLAN,
        sampled_outputs=outputs,
    )
    run.surface = {ms.NAME: _exchanges(outs)}
    return run


@pytest.mark.parametrize(
    "check,bug,plan_bug,kind",
    [
        ("test_mixed_greedy_follows_chain", "none", "none", None),
        ("test_mixed_greedy_follows_chain", "greedy_row_sampled", "none", "mismatch"),
        ("test_sampled_structure_matches_closed_form", "none", "none", None),
        ("test_sampled_structure_matches_closed_form", "none", "temperature_ignored", "mismatch"),
        ("test_seeded_repeats_identical", "none", "none", None),
        ("test_seeded_repeats_identical", "repeat_differs", "none", "mismatch"),
    ],
)
def test_smoke_checks_on_fake_runs(tmp_path, check, bug, plan_bug, kind):
    """The tier's checks on a fake sampled-mtp-topk1-no-overlap run from the CPU verify model: pass when right,
    'mismatch' naming the request when broken."""
    name = "sampled-mtp-topk1-no-overlap"
    mod = _smoke_module()
    assert name in mod.SAMPLED and name in mod.SEEDED  # the seeded server carries the flag
    run = _fake_run(tmp_path, name, bug, plan_bug=plan_bug)
    props = {}
    fn = getattr(mod, check)
    if kind is None:
        fn({name: run}, name, props.__setitem__)
        return
    with pytest.raises(CheckFailure) as err:
        fn({name: run}, name, props.__setitem__)
    print(err.value)
    assert err.value.kind == kind
    assert ("greedy:3" in str(err.value)) if bug == "greedy_row_sampled" else True
    assert ("repeat:2" in str(err.value)) if bug == "repeat_differs" else True


def test_seeded_check_needs_the_flag_on_the_server(tmp_path):
    name = "sampled-mtp-topk1-no-overlap"
    run = _fake_run(tmp_path, name, deterministic=False)
    with pytest.raises(CheckFailure) as err:
        _smoke_module().test_seeded_repeats_identical({name: run}, name, {}.__setitem__)
    assert err.value.kind == "harness"


def test_answered_wants_every_planned_request_answered():
    """The sampled families' checks stop on a short collection (harness) or a failed request (crash, with its
    parameters) before judging any distribution."""
    from types import SimpleNamespace

    from mtpmatrix.core.kinds import CheckFailure
    from mtpmatrix.tiers import surface

    ok = surface.Exchange("hot:0", {"sampling_params": {"temperature": 1.5}}, {"output_ids": [1]})
    bad = surface.Exchange("cold:1", {"sampling_params": {"temperature": 0.35}}, {}, "HTTP 500")
    run = SimpleNamespace(exchanges=lambda family: {"f": [ok, bad], "g": [ok]}[family])
    assert surface.answered(run, "g", 1) == [ok]
    with pytest.raises(CheckFailure) as short:
        surface.answered(run, "g", 2)
    assert short.value.kind == "harness" and "1 g exchanges for 2 planned requests" in str(short.value)
    with pytest.raises(CheckFailure) as failed:
        surface.answered(run, "f", 2)
    assert (
        failed.value.kind == "crash"
        and "1/2 f requests failed; first cold:1 {'temperature': 0.35}: HTTP 500" in str(failed.value)
    )
