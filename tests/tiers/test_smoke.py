"""Smoke tier: the live sglang MTP path on one GPU, tiny Gemma 4 pairs, no real weights.

Env knobs: MTPMATRIX_SMOKE_PAIR (tiny pair family, default e-series), MTPMATRIX_SMOKE_TP (default 1),
MTPMATRIX_SMOKE_SERVERS (comma-separated subset of smoke_servers.SMOKE_SERVERS names), MTPMATRIX_SMOKE_PARALLEL
(servers launched side by side; default from free GPU memory, see launch_plan.launch_parallelism),
MTPMATRIX_SMOKE_EXTRA_ARGS (sglang arguments appended to every smoke server, e.g. "--enable-deterministic-inference"),
MTPMATRIX_SMOKE_SWAP_DRAFTERS=1 (fault injection: serve the witness/constructed targets with the random pair's
assistant, a wrong-drafter combination the tier must fail on with an 'acceptance'/'mismatch' verdict).

The witness pair (mtpmatrix.pairs.witness) drafts right only when sglang hands its assistant the right hidden state, the
right target KV layer per attention type, the right positions, each tree node's own parent and each request's own
rows; built for sglang's draft phase (witness-mtp-*), its accept length is held to the exact pair's floor. The one
built for transformers' phase (witness-transformers-phase-topk1) says whether sglang drafts at the reference phase
(test_draft_phase_matches_transformers). The sampled pair (mtpmatrix.pairs.sampled) holds sampled requests
(temperature 0.7, top-k, top-p) to a closed-form token distribution with and without MTP
(test_sampled_distribution_matches_closed_form). The decoy witness (mtpmatrix.pairs.decoy, decoy-mtp-*) ranks a wrong
draft first at known inputs: each request's accept length is held to its exact prediction at the server's topk
(test_decoy_accept_matches_prediction). ``python -m mtpmatrix mutants`` shows which check kills which broken copy
of sglang's MTP code.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers import smoke
from mtpmatrix.tiers.compat import meta_fields, sglang_compat

pytestmark = pytest.mark.smoke

OPTIONS = smoke_servers.collection_options()
SPECS = list(OPTIONS.specs)
MTP_SPECS = [s for s in SPECS if s.topk]


def _run(smoke_runs, name, record_property) -> smoke.SmokeRun:
    return replay_run(smoke_runs[name], record_property)


@pytest.mark.check("launch")
@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_server_serves(smoke_runs, name, record_property):
    """The server launches, answers text and token-id requests, and returns non-empty output."""
    run = _run(smoke_runs, name, record_property)
    record_property("request_seconds", run.request_seconds)
    record_property("gpu_memory_mib", run.gpu_memory_mib)
    empty = [i for i, out in enumerate(run.id_outputs) if len(out) != smoke.MAX_NEW_TOKENS]
    if empty:
        raise CheckFailure("crash", f"{len(empty)} token-id requests returned != {smoke.MAX_NEW_TOKENS} tokens")
    if not all(run.text_outputs):
        raise CheckFailure("crash", "a text request returned empty text")


@pytest.mark.check("args")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS])
def test_resolved_mtp_args(smoke_runs, name, record_property):
    """The live server resolved NEXTN to FROZEN_KV_MTP with the requested topk / draft tokens, CUDA graph on."""
    run = _run(smoke_runs, name, record_property)
    sglang_compat.check_served_args(run.server_info_before or {}, run.spec.topk, record_property)


@pytest.mark.check("launch")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS])
def test_cuda_graphs_captured(smoke_runs, name, record_property):
    """Target and draft CUDA graphs were captured (read from the server log)."""
    run = _run(smoke_runs, name, record_property)
    target = len(smoke.TARGET_GRAPH_RE.findall(run.log_text))
    draft = len(smoke.DRAFT_GRAPH_RE.findall(run.log_text))
    record_property("target_graph_captures", target)
    record_property("draft_graph_captures", draft)
    if not target or not draft:
        raise CheckFailure("launch", f"CUDA graph capture lines in log: target={target}, draft={draft}")


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS])
def test_spec_metrics(smoke_runs, name, record_property):
    """Spec metrics are present per response and in /server_info; accept length per request at the all-drafts-
    accepted maximum for an exact pair, within [1, that maximum] for the random pair (a presence check: speculative
    decoding ran) and the transformers-phase witness (its floor is test_draft_phase_matches_transformers')."""
    from mtpmatrix.serving.client import spec_stats

    run = _run(smoke_runs, name, record_property)
    per_request = client.accept_length_from_meta(run.id_meta)
    server_side = spec_stats(run.server_info_after or {})
    avg = server_side.get("avg_spec_accept_length") if server_side else None
    record_property("accept_length_requests", per_request)
    record_property("avg_spec_accept_length", avg)
    problem = smoke.accept_length_problem(run.spec, run.id_meta)
    if problem:
        moved = smoke.phase_moved(run.spec, smoke_runs)
        raise CheckFailure("acceptance", f"{moved}; {problem}" if moved else problem)
    if avg is None:
        raise CheckFailure("acceptance", "/server_info has no avg_spec_accept_length")
    # The server's own counter must agree with what the requests saw (an accounting bug shows here, not above).
    metas = run.info_meta  # what /server_info had counted when it was read
    bounds = meta_fields.server_accept_bounds(metas, settings.NUM_STEPS)
    record_property("avg_spec_accept_length_bounds", list(bounds) if bounds else None)
    outside = meta_fields.server_accept_outside(metas, avg, settings.NUM_STEPS)
    if outside:
        raise CheckFailure("acceptance", outside)


@pytest.mark.check("accounting")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS])
def test_meta_info_fields_agree(smoke_runs, name, record_property):
    """Every speculative meta_info field this sglang release writes (meta_fields.SGLANG_META_FIELDS) is in each
    response and agrees with the others, with the request's completion tokens (the tail rule) and, in aggregate, with
    /server_info's avg_spec_accept_length. A miscounted field misleads every user who reads it, and the accept-length
    checks never look at most of them."""
    from mtpmatrix.serving.client import find_arg, spec_stats

    run = _run(smoke_runs, name, record_property)
    fields = meta_fields.documented_fields()
    draft_tokens = find_arg(
        run.server_info_before or {}, "speculative_num_draft_tokens", settings.DRAFT_TOKENS[run.spec.topk]
    )
    metas = run.all_meta  # every response's own fields; /server_info's counters: run.info_meta
    record_property("meta_fields", list(fields))
    found = [
        meta_fields.disagreements(m, fields=fields, draft_tokens=int(draft_tokens), steps=settings.NUM_STEPS)
        for m in metas
    ]
    bad = [(i, why) for i, why in enumerate(found) if why]
    record_property("requests_disagreeing", f"{len(bad)}/{len(metas)}")
    if bad:
        i, why = bad[0]
        raise CheckFailure(
            "accounting",
            f"{len(bad)}/{len(metas)} responses' speculative fields disagree; first (request {i}): {'; '.join(why)}",
        )
    server_side = spec_stats(run.server_info_after or {})
    if server_side is None:
        raise CheckFailure("accounting", "/server_info has no avg_spec_accept_length")
    outside = meta_fields.server_accept_outside(
        run.info_meta, server_side["avg_spec_accept_length"], settings.NUM_STEPS
    )
    if outside:
        raise CheckFailure("accounting", outside)


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS if s.phase_reference])
def test_draft_phase_matches_transformers(smoke_runs, name, record_property):
    """sglang drafts at transformers' RoPE phase: the witness built for transformers' draft phase reaches the exact
    pair's accept-length floor. sglang 0.5.13-0.5.23 put the draft query two positions behind transformers' (known
    upstream: sglang-gemma4-mtp-draft-rope-phase), reported apart from the hand-off checks."""
    from mtpmatrix.pairs.witness import phase

    run = _run(smoke_runs, name, record_property)
    got = client.accept_length_from_meta(run.id_meta)
    floor = smoke.EXACT_PAIR_MIN_ACCEPT[run.spec.topk]
    record_property("accept_length_requests", got)
    if got is None:
        raise CheckFailure("acceptance", "responses carry no spec_verify_ct (speculative decoding did not run)")
    if got >= floor:
        return
    # the sglang-phase witness at the same topk tells a phase difference from a broken hand-off
    gate = [
        client.accept_length_from_meta(r.id_meta)
        for r in smoke_runs.values()
        if r.spec.pair == "witness-sglang-phase" and r.spec.topk == run.spec.topk
    ]
    gate_ok = bool(gate) and gate[0] is not None and gate[0] >= floor
    why = (
        f"; the witness built for sglang's phase accepts {gate[0]:.2f}: sglang's draft query reads the last "
        f"accepted key at phase {phase.sglang_draft_phase():+d}, transformers' at "
        f"{phase.REFERENCE_DRAFT_PHASE:+d}"
        if gate_ok
        else ""
    )
    raise CheckFailure(
        "acceptance",
        f"draft query is not at transformers' RoPE phase: the transformers-phase "
        f"witness accepts {got:.2f} per verify (floor {floor}){why}",
    )


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS if s.decoy])
def test_decoy_accept_matches_prediction(smoke_runs, name, record_property):
    """Decoy witness: every request's accept length (completion tokens / spec_verify_ct) equals the value
    mtpmatrix.pairs.decoy predicts for its prompt at the server's topk, and so do its accepted-draft total and
    per-step histogram where the release reports them. Exact: the predicted tree is derived with margins of > 2 nats
    in the drafter's probabilities (bf16 moves them by < 0.2), so no tolerance. topk 1 lower (each decoy rejected),
    topk 3 higher (the right token, second, accepted through a node fed its own parent)."""
    from mtpmatrix.pairs import decoy

    run = _run(smoke_runs, name, record_property)
    prompts = smoke.id_prompts(run.vocab_size)
    if len(run.id_meta) != len(prompts):
        raise CheckFailure("crash", f"{len(run.id_meta)} responses for {len(prompts)} prompts")
    topk = run.spec.topk
    predicted = [
        decoy.predicted_counters(
            p,
            topk=topk,
            steps=settings.NUM_STEPS,
            draft_tokens=settings.DRAFT_TOKENS[topk],
            max_new_tokens=smoke.MAX_NEW_TOKENS,
        )
        for p in prompts
    ]
    record_property("predicted_accept_lengths", [p["accept_length"] for p in predicted])
    record_property("accept_lengths", [client.accept_length_from_meta([m]) for m in run.id_meta])
    misses = [(i, decoy.counter_mismatches(p, m)) for i, (p, m) in enumerate(zip(predicted, run.id_meta))]
    misses = [(i, what) for i, what in misses if what]
    if misses:
        i, what = misses[0]
        moved = smoke.phase_moved(run.spec, smoke_runs)
        raise CheckFailure(
            "acceptance",
            (f"{moved}; " if moved else "") + f"{len(misses)}/{len(prompts)} requests "
            f"miss the decoy prediction at topk {topk}; first: prompt ends "
            f"{prompts[i][-1]}: {'; '.join(what)}",
        )


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS if s.exact and s.topk and s.topk > 1])
def test_topk_batch_served_together(smoke_runs, name, record_property):
    """topk > 1 ran with several requests in one batch (the witness then checks each request's own rows)."""
    run = _run(smoke_runs, name, record_property)
    biggest = smoke.max_running_requests(run.log_text)
    record_property("max_running_requests", biggest)
    if biggest < smoke.WITNESS_MIN_BATCH:
        raise CheckFailure(
            "harness",
            f"largest logged batch had {biggest} requests; the tier needs >= "
            f"{smoke.WITNESS_MIN_BATCH} in one batch at topk {run.spec.topk}",
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS if s.exact])
def test_exact_pair_follows_rule(smoke_runs, name, record_property):
    """Witness/constructed pair: every greedy token is previous + 1, exactly, through the MTP path."""
    run = _run(smoke_runs, name, record_property)
    prompts = smoke.id_prompts(run.vocab_size)
    if len(run.id_outputs) != len(prompts):
        raise CheckFailure("crash", f"{len(run.id_outputs)} outputs for {len(prompts)} prompts")
    bad = [i for i, (p, out) in enumerate(zip(prompts, run.id_outputs)) if out != smoke.expected_constructed(p)]
    record_property("rule_sequences_ok", f"{len(prompts) - len(bad)}/{len(prompts)}")
    if bad:
        i = bad[0]
        raise CheckFailure(
            "mismatch",
            f"{len(bad)}/{len(prompts)} sequences break next=token+1; first: prompt "
            f"ends {prompts[i][-1]}, got {run.id_outputs[i][:8]}...",
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in MTP_SPECS if s.pair == "random" and s.load_format == "auto"])
def test_random_pair_agrees_with_no_mtp(smoke_runs, name, record_property):
    """Random weights: greedy MTP output equals no-MTP output, or first diverges at a bf16 near-tie of the no-MTP
    server's own logits (smoke.NEAR_TIE_NATS); any other divergence is a mismatch."""
    if "random-nomtp" not in smoke_runs:
        pytest.skip("random-nomtp server not selected (MTPMATRIX_SMOKE_SERVERS)")
    ref = _run(smoke_runs, "random-nomtp", record_property)
    run = _run(smoke_runs, name, record_property)
    pairs = list(zip(ref.id_outputs, run.id_outputs))
    if (
        not pairs
        or len(ref.id_outputs) != len(run.id_outputs)
        or any(len(x) != smoke.MAX_NEW_TOKENS for pair in pairs for x in pair)
    ):
        raise CheckFailure(
            "crash",
            f"output counts/lengths differ: {len(ref.id_outputs)} vs {len(run.id_outputs)} "
            f"sequences of {smoke.MAX_NEW_TOKENS} tokens expected",
        )
    same_tokens = sum(x == y for a, b in pairs for x, y in zip(a, b))
    divs = smoke.divergences(ref, run)
    real = [d for d in divs if not d.near_tie]
    record_property("identical_sequences", f"{len(pairs) - len(divs)}/{len(pairs)}")
    record_property("identical_token_fraction", round(same_tokens / max(1, sum(len(a) for a, _ in pairs)), 3))
    record_property("near_tie_divergences", len(divs) - len(real))
    record_property("divergence_gaps_nats", [d.gap_nats for d in divs])
    record_property("divergence_mtp_ranks", [d.mtp_rank for d in divs])
    if real:
        d = real[0]
        raise CheckFailure(
            "mismatch",
            f"{len(real)}/{len(pairs)} sequences diverge from no-MTP beyond a near-tie; "
            f"first: seq {d.sequence} pos {d.position} no-MTP {d.reference_token} vs "
            f"MTP {d.mtp_token} (rank {d.mtp_rank or f'>{smoke.TOP_LOGPROBS}'} there), logprob gap "
            f"{d.gap_nats} (> {smoke.NEAR_TIE_NATS})",
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in SPECS if s.pair == "sampled"])
def test_sampled_distribution_matches_closed_form(smoke_runs, name, record_property):
    """Sampled pair: the offsets of every sampled token (temperature 0.7, top-k, top-p) follow the target's closed
    form: none off the kept set, and Pearson's chi-square at false-alarm rate 1e-4 (mtpmatrix.pairs.sampled).
    Kind "mismatch": the output distribution differs from what sampling the target gives, the sampled counterpart of
    greedy outputs differing; the no-MTP server is held to the same closed form, so a failure there is sglang's
    sampler, and on an MTP server alone its verify."""
    from mtpmatrix.pairs.sampled import ring

    run = _run(smoke_runs, name, record_property)
    plan = run.sampled_requests
    short = [i for i, (r, out) in enumerate(zip(plan, run.sampled_outputs)) if len(out) != r.new_tokens]
    if not plan or len(run.sampled_outputs) != len(plan) or short:
        raise CheckFailure(
            "crash",
            f"{len(run.sampled_outputs)} sampled outputs for {len(plan)} requests, "
            f"{len(short)} not of {ring.NEW_TOKENS} tokens",
        )
    check = ring.check_outputs([r.prompt for r in plan], run.sampled_outputs, run.vocab_size)
    info = run.server_info_after or {}
    record_property("sampled_offsets", check.n)
    record_property("sampled_counts", {str(d): c for d, c in check.counts.items()})
    record_property("sampled_closed_form", {str(d): round(p, 6) for d, p in check.expected.items()})
    record_property("sampled_off_support", check.off_support)
    record_property("sampled_chi_square", round(check.statistic, 3))
    record_property("sampled_p_value", check.p_value)
    record_property("sampled_detectable_tv", round(check.detectable_tv, 4))
    # sampling_seed is sent with every request; sglang honours it only under --enable-deterministic-inference
    record_property("sampled_seed_honoured", bool(info.get("enable_deterministic_inference")))
    if run.spec.topk:
        record_property("sampled_accept_length", client.accept_length_from_meta(run.sampled_meta))
    if check.off_support:
        r, pos, prev, tok = check.first_off_support
        raise CheckFailure(
            "mismatch",
            f"{check.off_support} sampled tokens off the kept offsets "
            f"{list(ring.KEPT_OFFSETS)} (probability 0 under the closed form); first: "
            f"request {r} position {pos}: {prev} -> {tok}; {check.summary()}",
        )
    if not check.passed:
        raise CheckFailure("mismatch", f"sampled token distribution differs from the closed form: {check.summary()}")
