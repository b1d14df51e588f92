"""Smoke tier, sampled pair: the bonus token sampled after a fully accepted verify step at T > 0.

The bonus family (mtpmatrix.tiers.surface.bonus) sends requests into the sampled pair's second region
(mtpmatrix.pairs.sampled.bonus), where the drafter drafts the target's five-token chains exactly: with MTP every
verify step accepts all five drafts and every 6th output token is its bonus token, drawn from a closed form over the
chain starts at the request's temperature and top-k. Without MTP the same tokens are plain sampling.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run

pytestmark = pytest.mark.smoke

OPTIONS = smoke_servers.collection_options()
SAMPLED = [s.name for s in OPTIONS.specs if s.pair == "sampled"]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", SAMPLED)
def test_bonus_tokens_match_closed_form(smoke_runs, name, record_property):
    """Region-2 requests of the sampled pair: every chain token exactly the chain (probability >= 1 - 2.4e-11 each),
    every token after the spread token a kept chain start, and those at positions >= 1 (with MTP: the bonus tokens of
    fully accepted verify steps, positions 6, 12, ...) held to the spread closed form of their group by Pearson's
    chi-square at false-alarm rate 1e-4 (pairs.sampled.bonus). On an MTP server, verify steps that accepted fewer
    than all five drafts (sum of the histogram's last bin) leave bonus positions untested: kind "acceptance"."""
    from mtpmatrix.pairs.sampled import bonus as pb
    from mtpmatrix.tiers import surface
    from mtpmatrix.tiers.surface import bonus

    run = replay_run(smoke_runs[name], record_property)
    planned = bonus.plan()
    exchanges = surface.answered(run, bonus.NAME, len(planned))
    short = [x.label for x, p in zip(exchanges, planned) if len(x.output_ids) != p.new_tokens]
    if short:
        raise CheckFailure(
            "crash",
            f"{len(short)} {bonus.NAME} outputs not of their max_new_tokens {bonus.NEW_TOKENS}, first {short[0]}",
        )
    check = pb.check_streams(bonus.streams(exchanges), run.vocab_size)
    steps = [bonus.full_steps(x.meta) for x in exchanges]
    verify = sum(v for v, _ in steps if v is not None)
    full = sum(f for _, f in steps if f is not None)
    record_property("bonus_positions", check.n_bonus)
    record_property("bonus_prefill_tokens", check.n_first)
    record_property("bonus_counts", check.counts)
    record_property("bonus_closed_form", {k: [round(p, 6) for p in v] for k, v in check.laws.items()})
    record_property("bonus_chi_square", round(check.statistic, 3))
    record_property("bonus_df", check.df)
    record_property("bonus_p_value", check.p_value)
    record_property("bonus_deviating_requests", check.deviations)
    record_property("bonus_verify_steps", verify if run.spec.topk else None)
    record_property("bonus_all_drafts_accepted_steps", full if run.spec.topk else None)
    if check.deviations:
        label, pos, prev, tok, due = check.first_deviation
        raise CheckFailure(
            "mismatch",
            f"{check.deviations}/{len(exchanges)} bonus requests leave the region's chains "
            f"(probability <= 2.4e-11 per token under a correct sampler); first: {label} "
            f"position {pos}: {prev} -> {tok}, due {due}; {check.summary()}",
        )
    if not check.passed:
        raise CheckFailure("mismatch", f"bonus-position tokens do not follow the spread closed form: {check.summary()}")
    if run.spec.topk and full < check.n_bonus:
        raise CheckFailure(
            "acceptance",
            f"{full} verify steps accepted all {pb.STEPS} drafts for {check.n_bonus} "
            f"bonus positions ({verify} verify steps): the drafter left the region's "
            f"chains, so those tokens were not bonus tokens; {check.summary()}",
        )
