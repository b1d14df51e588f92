"""Smoke tier, sampled pair: mixed sampling in one batch, a sampled check that sees structure, seeded repeats.

The mixed_sampling family (mtpmatrix.tiers.surface.mixed_sampling) sends groups whose closed forms differ (T 1.5
top-k 4, T 0.35 top-k 3) and greedy requests in the same batch as the sampled plan (T 0.7); each sampled group is held
to its own closed form by the structure tests (mtpmatrix.pairs.sampled.structure), the greedy requests to the
pair's greedy chain exactly, and on a server with --enable-deterministic-inference two identical seeded requests to
identical outputs.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run

pytestmark = pytest.mark.smoke

OPTIONS = smoke_servers.collection_options()
SAMPLED = [s.name for s in OPTIONS.specs if s.pair == "sampled"]
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
SEEDED = [
    s.name for s in OPTIONS.specs if s.pair == "sampled" and DETERMINISTIC_FLAG in (*s.mode_args, *OPTIONS.extra_args)
]


def _family(run):
    from mtpmatrix.tiers import surface
    from mtpmatrix.tiers.surface import mixed_sampling

    return surface.answered(run, mixed_sampling.NAME, len(mixed_sampling.plan()))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", SAMPLED)
def test_mixed_greedy_follows_chain(smoke_runs, name, record_property):
    """Greedy requests batched with sampled ones (T 0.35 / 0.7 / 1.5, top-k 3 / 4, top-p 0.83 / 0.95 / 1) come out as
    the sampled pair's greedy chain, offset d1 = 1 at every step, exactly: the target's argmax is d1 with a 0.375
    logit margin (exact in bf16), and sglang runs temperature 0 as top_k 1, so any other request's temperature /
    top-k / top-p on a greedy request's verify rows shows as an off-chain token."""
    from mtpmatrix.tiers.surface import mixed_sampling

    run = replay_run(smoke_runs[name], record_property)
    bad, n = mixed_sampling.greedy_problems(_family(run))
    record_property("greedy_requests", n)
    record_property("greedy_off_chain", len(bad))
    if bad:
        raise CheckFailure(
            "mismatch",
            f"{len(bad)}/{n} greedy requests batched with sampled ones leave the greedy "
            f"chain (next = previous + {mixed_sampling.GREEDY_OFFSET} on the ring); first: "
            f"{bad[0]}",
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", SAMPLED)
def test_sampled_structure_matches_closed_form(smoke_runs, name, record_property):
    """Every sampled token of the plan and the mixed_sampling family, each group held to its own closed form: none
    off its kept offsets, and per-group, per-position (blocks of 16, period 6), transition, verify-depth (exact at
    topk 1) and first-token tests, family-wise false-alarm rate 1e-4 (Bonferroni, pairs.sampled.structure)."""
    from mtpmatrix.pairs.sampled import structure
    from mtpmatrix.tiers.surface import mixed_sampling

    run = replay_run(smoke_runs[name], record_property)
    exchanges = _family(run)
    plan = run.sampled_requests
    streams = [(f"plan:{i}", r.group, r.prompt, out) for i, (r, out) in enumerate(zip(plan, run.sampled_outputs))]
    streams += [(p.label, p.group, p.prompt, out) for p, out in mixed_sampling.sampled_streams(exchanges)]
    wanted = [r.new_tokens for r in plan] + [p.new_tokens for p, _ in mixed_sampling.sampled_streams(exchanges)]
    short = [s[0] for s, n in zip(streams, wanted) if len(s[3]) != n]
    if not plan or len(run.sampled_outputs) != len(plan) or short:
        raise CheckFailure(
            "crash",
            f"{len(run.sampled_outputs)} plan outputs for {len(plan)} requests; "
            f"{len(short)} sampled outputs not of their max_new_tokens, first {short[:1]}",
        )
    check = structure.check_streams(streams, run.vocab_size)
    record_property("structure_offsets", check.n)
    record_property("structure_off_support", check.off_support)
    record_property(
        "structure_tests",
        {
            t.name: {
                "chi2": None if t.statistic != t.statistic else round(t.statistic, 2),
                "df": t.df,
                "p": t.p_value,
                "strata": t.strata,
                "dropped": t.dropped,
            }
            for t in check.tests
        },
    )
    record_property("structure_test_alpha", structure.TEST_ALPHA)
    if check.off_support:
        label, pos, prev, tok, group = check.first_off_support
        raise CheckFailure(
            "mismatch",
            f"{check.off_support} sampled tokens off their group's kept offsets "
            f"(probability 0 under its closed form); first: {label} ({group}) position "
            f"{pos}: {prev} -> {tok}; {check.summary()}",
        )
    if not check.passed:
        names = ", ".join(t.name for t in check.failed)
        raise CheckFailure(
            "mismatch", f"sampled tokens show structure the closed form forbids ({names}): {check.summary()}"
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", SEEDED)
def test_seeded_repeats_identical(smoke_runs, name, record_property):
    """With --enable-deterministic-inference, two identical requests (same prompt, same sampling_seed, T 1.5, sent in
    the same batch) give identical outputs. sglang honours sampling_seed only under that flag
    (sampling_batch_info.SamplingBatchInfo.from_schedule_batch); 0.5.17 seeds verify's coins from it
    (eagle_utils._verify_coins / _seeded_verify_coins), 0.5.13 draws them from torch.rand (eagle_info.py
    EagleVerifyInput.verify): docs/upstream/sglang-seeded-verify-coins.md."""
    from mtpmatrix.tiers.surface import mixed_sampling

    run = replay_run(smoke_runs[name], record_property)
    info = run.server_info_after or run.server_info_before or {}
    record_property("enable_deterministic_inference", info.get("enable_deterministic_inference"))
    if not info.get("enable_deterministic_inference"):
        raise CheckFailure(
            "harness",
            f"/server_info reports enable_deterministic_inference="
            f"{info.get('enable_deterministic_inference')!r} though {DETERMINISTIC_FLAG} was "
            f"passed: the seeded check cannot run",
        )
    pairs = mixed_sampling.repeat_pairs(_family(run))
    differ = [(a, b) for a, b in pairs if a is None or a.output_ids != b.output_ids]
    record_property("seeded_pairs", len(pairs))
    record_property("seeded_pairs_differing", len(differ))
    if not pairs:
        raise CheckFailure("harness", "no repeated seeded requests were sent")
    if differ:
        a, b = differ[0]
        if a is None:
            raise CheckFailure("harness", f"{b.label}: its original request is missing")
        pos = next(
            (i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y),
            min(len(a.output_ids), len(b.output_ids)),
        )
        raise CheckFailure(
            "mismatch",
            f"{len(differ)}/{len(pairs)} identical seeded requests (same prompt, "
            f"sampling_seed {b.payload['sampling_params'].get('sampling_seed')}) differ "
            f"under {DETERMINISTIC_FLAG}; first: {a.label} vs {b.label} from position "
            f"{pos}: "
            f"{a.output_ids[pos : pos + 6]} vs {b.output_ids[pos : pos + 6]}",
        )
