"""Smoke tier, request family "features" (mtpmatrix.tiers.surface.features): sampling features users set, under
MTP against no-MTP. Predicted deviations of intact sglang are not excused: they fail here and are written up in
docs/upstream/ (sglang-mtp-verify-penalty-state.md, sglang-mtp-verify-ignores-min-p.md,
sglang-mtp-verify-skips-custom-logit-processor.md)."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import features, logprobs

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if s.pair == features.WITNESS_PAIR]
SAMPLED = [s for s in SPECS if s.pair == features.SAMPLED_PAIR and not features.deterministic(s)]
UPSTREAM = {
    "min-new-tokens-released": "sglang-mtp-verify-penalty-state",
    "repetition-boost": "sglang-mtp-verify-penalty-state",
    "min-p": "sglang-mtp-verify-ignores-min-p",
    features.CUSTOM: "sglang-mtp-verify-skips-custom-logit-processor",
}


def _exchange(run, label):
    found = [x for x in run.exchanges(features.NAME) if x.label == label]
    if not found:
        raise CheckFailure("crash", f"no '{label}' exchange collected on {run.spec.name}")
    ex = found[0]
    # every feature here exists in sglang 0.5.13-0.5.23 (sampling_params.py; custom logit processors behind
    # --enable-custom-logit-processor, which every witness server sets): a refusal is a failure
    if ex.error:
        raise CheckFailure("crash", f"'{label}' request failed on {run.spec.name}: {ex.error}")
    return ex


@pytest.mark.check("mismatch")
@pytest.mark.parametrize(
    "name,feature", [pytest.param(s.name, f, id=f"{s.name}-{f}") for s in WITNESS for f in features.WITNESS_FEATURES]
)
def test_feature_matches_no_mtp(smoke_runs, name, feature, record_property):
    """Witness, greedy, one request per feature: the output meets the feature's own exact prediction
    (features.predicted: logit_bias -100 removes the chain's 4th token; min_new_tokens 32 masks the stop token at
    output 9, min_new_tokens 8 lets it end the request there; +-2 frequency / presence and repetition 2 leave the
    chain as it is, a margin of 5.66 nats; the custom logit processor puts token 4 + 40 in place of the chain's 4th
    token, which the chain then follows) and, on an MTP server, equals the witness without MTP token for token
    (repetition 0.1, which repeats tokens while drafts are accepted, has only that). Exact: the witness's argmax
    is >= 7.66 nats clear; where an output has no prediction (past logit_bias's position, repetition-boost) a
    divergence at a no-MTP margin within the bf16 bound (logprobs.TOLERANCE_NATS, scaled by the feature's logit
    scaling) is no deviation."""
    run = replay_run(smoke_runs[name], record_property)
    ex = _exchange(run, feature)
    got = ex.output_ids
    record_property("output_ids", got)
    record_property("repeated_tokens", features.repeats(got))
    record_property("finish_reason", ex.meta.get("finish_reason"))
    if run.spec.topk:
        record_property(
            "accept_length", round(len(got) / ex.meta["spec_verify_ct"], 4) if ex.meta.get("spec_verify_ct") else None
        )
    upstream = f" (predicted for intact sglang: docs/upstream/{UPSTREAM[feature]}.md)" if feature in UPSTREAM else ""
    own = features.predicted(feature, got)
    if own:
        deviation = run.spec.topk and features.predicted(feature, got, mtp_intact_sglang=True) is None
        raise CheckFailure("mismatch", f"{feature} on {name}: {own}" + (upstream if deviation else ""))
    if not run.spec.topk:
        return
    if logprobs.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{logprobs.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    ref = _exchange(replay_run(smoke_runs[logprobs.REFERENCE_SERVER], record_property), feature)
    record_property("reference_output_ids", ref.output_ids)
    record_property("reference_repeated_tokens", features.repeats(ref.output_ids))
    why = features.divergence(feature, got, ref)
    if why:
        raise CheckFailure("mismatch", f"{why}{upstream}")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in SAMPLED])
def test_min_p_matches_closed_form(smoke_runs, name, record_property):
    """Sampled pair, temperature 0.7 and min_p 0.26, no top-k / top-p: min_p keeps offsets d1-d3 (probability
    ratios 1, 0.586, 0.344 to the largest) and cuts d4 (0.201) and every other token, so the offsets follow
    ring.closed_form: none off the kept set (probability exactly 0) and Pearson's chi-square at false-alarm rate
    1e-4 (ring.check_outputs), over features.MIN_P_REQUESTS x MIN_P_NEW_TOKENS offsets, with and without MTP.
    sglang's verify applies no min_p (0.5.13 eagle_info.EagleVerifyInput.verify, 0.5.17 eagle_utils.eagle_sample):
    intact MTP is predicted to emit d4 at ~9% of the tokens verify samples."""
    from mtpmatrix.pairs.sampled import ring

    run = replay_run(smoke_runs[name], record_property)
    exchanges = [_exchange(run, f"min-p-{i}") for i in range(features.MIN_P_REQUESTS)]
    outputs = [x.output_ids for x in exchanges]
    short = [x.label for x in exchanges if len(x.output_ids) != features.MIN_P_NEW_TOKENS]
    if short:
        raise CheckFailure(
            "crash", f"{len(short)} min_p requests not of {features.MIN_P_NEW_TOKENS} tokens: {short[:3]}"
        )
    check = ring.check_outputs([x.payload["input_ids"] for x in exchanges], outputs, run.vocab_size)
    record_property("min_p_offsets", check.n)
    record_property("min_p_counts", {str(d): c for d, c in check.counts.items()})
    record_property("min_p_off_support", check.off_support)
    record_property("min_p_p_value", check.p_value)
    record_property("min_p_ratios", {str(d): round(r, 4) for d, r in features.min_p_kept_ratios().items()})
    upstream = f" (predicted for intact sglang: docs/upstream/{UPSTREAM['min-p']}.md)" if run.spec.topk else ""
    if check.off_support:
        r, pos, prev, tok = check.first_off_support
        raise CheckFailure(
            "mismatch",
            f"{check.off_support} min_p-sampled tokens off the kept offsets "
            f"{list(ring.KEPT_OFFSETS)} (min_p {features.MIN_P} cuts the rest: "
            f"probability 0); first: request min-p-{r} position {pos}: {prev} -> {tok} "
            f"(offset {ring.offset_of(prev, tok)}); {check.summary()}{upstream}",
        )
    if not check.passed:
        raise CheckFailure("mismatch", f"min_p-sampled offsets differ from the closed form: {check.summary()}")
