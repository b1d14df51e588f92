"""GSM8K tier: real Gemma 4 pairs behind a live sglang server with Frozen-KV MTP, CUDA graphs on.

For every case (mtpmatrix.tiers.gsm8k_runs: a pair in settings.DEFAULT_PAIRS at every topk in settings.TOPKS, or
each ``--server-url`` server), one server runs GSM8K 5-shot (the exact prompts/scoring of sglang's run_eval gsm8k,
see mtpmatrix.tiers.gsm8k_eval) and three checks read what it did:

  test_args        /server_info resolved the requested algorithm/topk/steps/draft tokens, CUDA graph not disabled
  test_accuracy    GSM8K score >= the pair's threshold (Wilson 95% interval recorded)
  test_acceptance  /server_info avg_spec_accept_length >= settings.MIN_ACCEPT_LENGTH; absent = failure

Per-question records go to ``gsm8k/<case>.jsonl`` and the server log to ``server-gsm8k-<case>.log`` in the
``mtp_results_dir`` folder (the row folder under nox; names and metrics in mtpmatrix.core.schema).

``--server-url URL`` (repeatable) runs the same checks against sglang servers someone else started instead of
launching any. The env knobs (pairs, no-MTP baseline, number of questions, weights, the tiny end-to-end proof mode)
are listed in mtpmatrix.tiers.gsm8k_runs.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core import schema, settings, stats
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.compat import sglang_compat
from mtpmatrix.tiers.gsm8k_runs import Case, Gsm8kRun, Gsm8kRuns, cases
from mtpmatrix.tiers.session.plugin import SERVED_KEY

pytestmark = pytest.mark.gsm8k

MTP_ONLY = ("test_acceptance",)  # checks that only mean something with speculative decoding on


def pytest_generate_tests(metafunc):
    """Every check runs once per case; the cases come from the session (--server-url) or settings.py."""
    if "gsm8k_run" not in metafunc.fixturenames:
        return
    try:
        selected = cases(metafunc.config.stash.get(SERVED_KEY, []))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if metafunc.function.__name__ in MTP_ONLY:
        selected = [c for c in selected if c.topk is not None]
    metafunc.parametrize("gsm8k_run", selected, ids=[c.id for c in selected], indirect=True)


@pytest.fixture(scope="session")
def gsm8k_runs(mtp_results_dir, mtp_progress) -> Gsm8kRuns:
    """Each case's server, launched (or scored) once for all the checks that read it."""
    return Gsm8kRuns(mtp_results_dir, mtp_progress)


@pytest.fixture
def gsm8k_run(request, gsm8k_runs) -> Gsm8kRun:
    case: Case = request.param
    run = gsm8k_runs.get(case)
    if run.skip:
        pytest.skip(run.skip)
    return run


def _use(run: Gsm8kRun, record_property) -> Gsm8kRun:
    if run.case.served:
        record_property(schema.SERVED, run.case.served)
    return replay_run(run, record_property)


# --- checks ------------------------------------------------------------------------------------------------------------
@pytest.mark.check("args")
def test_args(gsm8k_run, record_property):
    """The live server resolved the requested speculative config, with CUDA graphs on."""
    run = _use(gsm8k_run, record_property)
    info = run.info_before or {}
    disabled = client.cuda_graph_disabled(info)
    record_property("cuda_graph_disabled", disabled)
    if run.case.topk is not None:  # the check the smoke and contract tiers run too
        sglang_compat.check_served_args(info, run.case.topk, record_property)
        return
    algo = client.find_arg(info, "speculative_algorithm")
    record_property("speculative_algorithm", algo)
    if algo not in (None, "", "NONE"):
        raise CheckFailure("args", f"baseline server resolved speculative_algorithm={algo!r}, expected none")
    if disabled is not False:
        raise CheckFailure("args", f"CUDA graph not on per /server_info (disabled={disabled})")


@pytest.mark.check("accuracy")
def test_accuracy(gsm8k_run, gsm8k_runs, record_property):
    """GSM8K 5-shot score >= the pair's threshold (tiny proof mode: reported, not gated)."""
    run = _use(gsm8k_run, record_property)
    res = run.result
    lo, hi = res.wilson95
    thr = run.case.threshold
    record_property(schema.SCORE, round(res.score, 4))
    record_property(schema.WILSON95, [round(lo, 4), round(hi, 4)])
    record_property(schema.NUM_CORRECT, res.num_correct)
    record_property(schema.NUM_EXAMPLES, res.num_examples)
    record_property("num_invalid", res.num_invalid)
    record_property("num_errors", res.num_errors)
    record_property(schema.OUTPUT_TOKENS_PER_S, res.output_tokens_per_s)
    record_property("wall_s", res.wall_s)
    record_property(schema.THRESHOLD, thr)
    record_property(schema.GATED, thr is not None)
    record_property(schema.RECORDS, schema.gsm8k_records(run.case.id))
    if run.case.topk is not None:
        base = gsm8k_runs.baseline_of(run.case)
        if base is not None and base.result is not None and base.result.num_examples == res.num_examples:
            cmp = stats.paired_compare(base.result.correct_list, res.correct_list)
            record_property(schema.SPEEDUP, stats.speedup(base.result.output_tokens_per_s, res.output_tokens_per_s))
            record_property(
                schema.VS_NOMTP,
                {"delta": round(cmp.delta, 4), "lost": cmp.only_a, "gained": cmp.only_b, "mcnemar_p": cmp.p_value},
            )
    if res.num_errors:
        raise CheckFailure(
            "crash",
            f"{res.num_errors}/{res.num_examples} GSM8K requests failed: "
            f"{res.first_errors[0] if res.first_errors else '?'}",
        )
    if thr is not None and res.score < thr:
        raise CheckFailure(
            "accuracy",
            f"GSM8K score {res.score:.3f} < threshold {thr} ({res.num_correct}/"
            f"{res.num_examples}, Wilson 95% [{lo:.3f}, {hi:.3f}])",
        )


@pytest.mark.check("acceptance")
def test_acceptance(gsm8k_run, record_property):
    """avg_spec_accept_length from /server_info after the run >= the floor; absent is a failure."""
    run = _use(gsm8k_run, record_property)
    # the tiny proof pair: a presence check (speculative decoding ran), not a gate
    floor = settings.NO_DRAFT_ACCEPT_LENGTH if run.case.tiny else settings.MIN_ACCEPT_LENGTH
    st = client.spec_stats(run.info_after)
    avg = st["avg_spec_accept_length"] if st else None
    record_property(schema.ACCEPT_LENGTH, avg)
    record_property("accept_length_requests", run.result.spec_accept_length)
    record_property(schema.MIN_ACCEPT_LENGTH, floor)
    if avg is None:
        raise CheckFailure("acceptance", "/server_info has no avg_spec_accept_length after the GSM8K run")
    if avg < floor:
        raise CheckFailure("acceptance", f"avg_spec_accept_length {avg:.3f} < {floor}")
