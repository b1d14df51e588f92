"""Smoke tier, request family "stops" (mtpmatrix.tiers.surface.stops): EOS, stop tokens, stop strings and
max_new_tokens landing inside a run of accepted drafts, on the witness pair at sglang's draft phase, whose every
output token and every verify step is known. Each request's output_ids, finish_reason (and, for stop strings, text)
must equal the prediction and the no-MTP witness's; its counters must agree with its output; and the witness MTP
servers' speculative counters are held to exact per-request values (the greedy id and text requests too).
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers import smoke
from mtpmatrix.tiers.surface import stops

pytestmark = pytest.mark.smoke

OPTIONS = smoke_servers.collection_options()
SERVED = [s for s in OPTIONS.specs if s.pair == stops.PAIR]
SERVED_MTP = [s for s in SERVED if s.topk]


def _reference(smoke_runs, run, record_property):
    """The no-MTP witness's run for MTP equals no-MTP; None for that server itself or when it is not selected or
    failed (its own checks report that)."""
    ref = smoke_runs.get(stops.NO_MTP_REFERENCE)
    if run.spec.name == stops.NO_MTP_REFERENCE or ref is None or ref.error is not None:
        record_property("no_mtp_reference", None)
        return None
    record_property("no_mtp_reference", stops.NO_MTP_REFERENCE)
    return ref


def _judge_outputs(smoke_runs, name, record_property, kind: str, what: str) -> None:
    run = replay_run(smoke_runs[name], record_property)
    ref = _reference(smoke_runs, run, record_property)
    bad, seen = stops.judge(run, kind, run.vocab_size, ref)
    record_property(f"{kind}_requests", seen)  # label -> [completion_tokens, finish_reason]
    record_property(f"{kind}_requests_wrong", [label for label, _ in bad])
    if bad:
        label, problems = bad[0]
        raise CheckFailure(
            "mismatch",
            f"{len(bad)}/{len(seen) or len(bad)} {what} requests end wrong; first: "
            f"{label} {problems[0]}{'; '.join(problems[1:])}",
        )


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in SERVED])
def test_stop_ends_the_output_exactly(smoke_runs, name, record_property):
    """ignore_eos false: an EOS (EOS_ID, or END_OF_TURN_ID through generation_config), a stop_token_ids id or a stop
    string on the prefill token, strictly inside a verify step's accepted drafts or on its bonus token ends the
    output exactly there: output_ids through the stop and nothing after it, finish_reason {"type": "stop",
    "matched": ...}, the stop string cut from text; an EOS earlier in a step than a stop string wins. MTP output_ids
    and finish_reason equal the no-MTP witness's."""
    _judge_outputs(smoke_runs, name, record_property, "stop", "stop")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in SERVED])
def test_length_cut_mid_step(smoke_runs, name, record_property):
    """max_new_tokens inside a verify step (10: step 2 keeps positions 8-13; and 1, the prefill token): exactly that
    many tokens, finish_reason length; an EOS in the crossing step before the limit still ends the output there
    (stop), one after it does not; an EOS exactly at the limit may read as either (a release convention) but the
    output is the same. MTP equals no-MTP."""
    _judge_outputs(smoke_runs, name, record_property, "length", "max_new_tokens")


@pytest.mark.check("accounting")
@pytest.mark.parametrize("name", [s.name for s in SERVED])
def test_finished_request_counters_agree(smoke_runs, name, record_property):
    """Every request of the family agrees with itself, in every release: completion_tokens = len(output_ids) <=
    max_new_tokens, a length finish at exactly max_new_tokens, a matched stop id ending output_ids, a matched string
    among those requested, and on MTP servers the speculative fields consistent with each other and with the
    completion tokens (no verify step counted after the finish, none missing before it)."""
    from mtpmatrix.serving.client import find_arg
    from mtpmatrix.tiers.compat import meta_fields

    run = replay_run(smoke_runs[name], record_property)
    fields = draft_tokens = None
    if run.spec.topk:
        fields = meta_fields.documented_fields()
        draft_tokens = int(
            find_arg(run.server_info_before or {}, "speculative_num_draft_tokens", settings.DRAFT_TOKENS[run.spec.topk])
        )
    by_label = {x.label: x for x in run.exchanges(stops.NAME)}
    bad, counters = [], {}
    for case in stops.cases(run.vocab_size):
        x = by_label.get(case.label)
        if x is None:
            bad.append((case.label, ["no exchange: the tier did not send this request"]))
            continue
        counters[case.label] = {
            k: x.meta.get(k)
            for k in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram")
        }
        problems = stops.accounting_problems(case, x, fields=fields, draft_tokens=draft_tokens)
        if problems:
            bad.append((case.label, problems))
    record_property("stops_counters", counters)
    if bad:
        label, problems = bad[0]
        raise CheckFailure(
            "accounting",
            f"{len(bad)}/{len(counters) or len(bad)} stop/length requests contradict "
            f"their own counters; first: {label}: {'; '.join(problems)}",
        )


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", [s.name for s in SERVED_MTP])
def test_witness_counters_match_prediction(smoke_runs, name, record_property):
    """The witness accepts every draft, so each request's speculative counters are exact, as the decoy's are
    (test_decoy_accept_matches_prediction): n output tokens take spec_verify_ct = ceil((n - 1) / 6) steps, each
    accepting all 5 drafts (spec_num_correct_drafts = 5 V, histogram [0, 0, 0, 0, 0, V]; a stop cuts the output,
    not the count); n = 1 runs no verify step. Held for the greedy id and text requests (n = 32: 6 steps, 30 drafts)
    and for every stop/length request at its predicted length."""
    run = replay_run(smoke_runs[name], record_property)
    vocab = run.vocab_size
    requests = [(f"id[{i}]", smoke.MAX_NEW_TOKENS, m) for i, m in enumerate(run.id_meta)]
    requests += [(f"text[{i}]", smoke.MAX_NEW_TOKENS, m) for i, m in enumerate(run.text_meta)]
    by_label = {x.label: x for x in run.exchanges(stops.NAME)}
    requests += [(c.label, c.n, by_label[c.label].meta) for c in stops.cases(vocab) if c.label in by_label]
    if len(run.id_meta) != smoke.N_ID_PROMPTS or len(by_label) != len(stops.cases(vocab)):
        raise CheckFailure(
            "crash",
            f"{len(run.id_meta)} id responses for {smoke.N_ID_PROMPTS} prompts, "
            f"{len(by_label)} stop/length exchanges for {len(stops.cases(vocab))} requests",
        )
    record_property("predicted_verify_steps", {label: stops.verify_steps(n) for label, n, _ in requests})
    record_property("verify_steps", {label: m.get("spec_verify_ct") for label, _n, m in requests})
    misses = [(label, stops.counter_problems(n, m)) for label, n, m in requests]
    misses = [(label, what) for label, what in misses if what]
    if misses:
        label, what = misses[0]
        moved = smoke.phase_moved(run.spec, smoke_runs)
        raise CheckFailure(
            "acceptance",
            (f"{moved}; " if moved else "") + f"{len(misses)}/{len(requests)} requests "
            f"miss the witness's exact counters (every draft accepted); first: {label}: "
            f"{'; '.join(what)}",
        )
