"""smoke.py's pure parts: graph-capture log lines (as sglang 0.5.13 / 0.5.17 printed them on an H200), prompts,
the constructed-pair rule, accept length from meta_info, the near-tie judgement of divergences, the launch plan and
the smoke options. The collection against the fake server: test_smoke_collect.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.serving import client, launch_plan
from mtpmatrix.tiers import smoke
from mtpmatrix.tiers.compat import meta_fields

# Verbatim from the H200 server logs of 2026-11-30 (docs/runs/).
LOG_0513 = """\
[2026-11-30 06:23:21] Capture cuda graph end. Time elapsed: 6.54 s. mem usage=0.04 GB. avail mem=138.96 GB.
[2026-11-30 06:23:25] Capture Frozen-KV MTP draft cuda graph end.
"""
LOG_0517 = """\
[2026-11-30 06:08:05] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=6, bs=[1, 2]
[2026-11-30 06:08:06] Capture target verify CUDA graph end. elapsed=1.44 s, mem usage=0.04 GB, avail mem=137.45 GB.
[2026-11-30 06:08:06] Capture Frozen-KV MTP draft cuda graph begin.
[2026-11-30 06:08:10] Capture Frozen-KV MTP draft cuda graph end.
"""
NO_DRAFT = "[2026-11-30 06:05:57] Capture target decode CUDA graph end. elapsed=73.26 s, mem usage=0.04 GB\n"


@pytest.mark.parametrize("log,target,draft", [(LOG_0513, 1, 1), (LOG_0517, 1, 1), (NO_DRAFT, 1, 0), ("", 0, 0)])
def test_graph_capture_lines(log, target, draft):
    assert len(smoke.TARGET_GRAPH_RE.findall(log)) == target
    assert len(smoke.DRAFT_GRAPH_RE.findall(log)) == draft


def test_draft_line_never_counts_as_target():
    assert not smoke.TARGET_GRAPH_RE.search("Capture Frozen-KV MTP draft cuda graph end.")
    assert not smoke.TARGET_GRAPH_RE.search("Capture draft cuda graph end. Time elapsed: 1 s")
    assert not smoke.TARGET_GRAPH_RE.search("Capture target verify CUDA graph begin.")


def test_id_prompts_stay_clear_of_specials_and_wrap():
    prompts = smoke.id_prompts(512)
    assert len(prompts) == smoke.N_ID_PROMPTS and all(len(p) == smoke.PROMPT_LEN for p in prompts)
    assert len({tuple(p) for p in prompts}) == len(prompts)
    for p in prompts:
        assert min(p) >= 16
        assert max(smoke.expected_constructed(p)) < 512  # the +1 rule never wraps to the low special ids


def test_expected_constructed_is_next_plus_one():
    assert smoke.expected_constructed([20, 30, 40], 4) == [41, 42, 43, 44]


def _run(outputs, top=None):
    run = smoke.SmokeRun(spec=smoke_servers.SMOKE_SERVERS[0], log_path=Path("x.log"))
    run.id_outputs = outputs
    run.id_top_logprobs = top or []
    return run


def test_divergences_judged_on_reference_logprobs():
    ref = _run(
        [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
        top=[
            [[(-0.1, 1)], [(-0.1, 2)], [(-0.1, 3)]],
            [[(-0.1, 4)], [(-0.50, 5), (-0.5039, 50)], [(-0.1, 6)]],  # near-tie at position 1
            [[(-0.1, 7)], [(-0.1, 8), (-2.0, 80)], [(-0.1, 9)]],
        ],
    )  # clear winner at position 1
    mtp = _run([[1, 2, 3], [4, 50, 51], [7, 80, 81]])
    divs = smoke.divergences(ref, mtp)
    assert [(d.sequence, d.position, d.reference_token, d.mtp_token) for d in divs] == [(1, 1, 5, 50), (2, 1, 8, 80)]
    assert divs[0].near_tie and divs[0].gap_nats == pytest.approx(0.0039)
    assert not divs[1].near_tie and divs[1].gap_nats == pytest.approx(1.9)
    assert [d.mtp_rank for d in divs] == [2, 2]


def test_divergence_outside_reference_top_k_is_never_a_near_tie():
    ref = _run([[1, 2]], top=[[[(-0.1, 1)], [(-0.1, 2), (-0.2, 3)]]])
    (d,) = smoke.divergences(ref, _run([[1, 9]]))
    assert d.gap_nats is None and not d.near_tie and d.mtp_rank is None


def test_server_args_for_specs():
    nomtp, dummy = smoke_servers.SMOKE_SERVERS[0], smoke_servers.SMOKE_SERVERS[1]
    args = smoke.server_args_for(nomtp, Path("/t"), Path("/a"), tp=1)
    assert "--speculative-algorithm" not in args and "--load-format" not in args
    args = smoke.server_args_for(dummy, Path("/t"), Path("/a"), tp=2)
    assert args[args.index("--load-format") + 1] == "dummy" and args[args.index("--tp-size") + 1] == "2"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == str(settings.DRAFT_TOKENS[dummy.topk])
    assert "--decode-log-interval" in args  # server-side accept length needs it (see settings.SMOKE_ARGS)
    args = smoke.server_args_for(dummy, Path("/t"), Path("/a"), tp=1, extra_args=("--enable-deterministic-inference",))
    assert args[-1] == "--enable-deterministic-inference"  # extras go last, so they override


# --- launch plan and options --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "free_mib,want",
    [(None, 1), (0, 1), (4 * 1024, 1), (12 * 1024, 2), (16 * 1024, 3), (24 * 1024, 5), (80 * 1024, 5), (10**7, 5)],
)
def test_launch_parallelism_from_free_memory(free_mib, want):
    assert launch_plan.launch_parallelism(5, free_mib) == want


def test_every_server_of_a_wave_fits_in_the_margin_the_others_leave():
    """sglang fails a launch when, once loaded, less than (1 - mem_fraction_static) of what was free at its start is
    still free: the others' SERVER_MIB each must fit in the fraction."""
    for free_gib in (8, 24, 48, 80, 125, 139, 149):
        n = launch_plan.memory_parallelism(free_gib * 1024)
        assert n * launch_plan.SERVER_MIB <= launch_plan.SMOKE_MEM_FRACTION * free_gib * 1024 or n == 1
        assert (n + 1) * launch_plan.SERVER_MIB > launch_plan.SMOKE_MEM_FRACTION * free_gib * 1024


def test_an_idle_h200_or_h100_plans_the_default_servers_in_one_wave():
    """What the README states: an idle H200 (143,771 MiB = 140.4 GiB, docs/runs/env-2-r17.txt; about 125-139 GiB
    free once the driver has its share) launches all default servers at once, and so is an idle H100 80GB (81,559
    MiB, ~79 GiB free) planned to since the fraction is 0.7 (11 at 0.42: docs/runs/2026-12-05f-h100-gpu-session.md)."""
    n = len(smoke_servers.DEFAULT_SMOKE_SERVERS)
    for free_gib in (79, 125, 139):
        assert launch_plan.launch_parallelism(n, free_gib * 1024) == n
    assert launch_plan.launch_parallelism(n, 79 * 1024, fraction=0.42) == 11  # what the H100 did
    assert launch_plan.launch_parallelism(n, 24 * 1024) == 5


def test_the_wave_follows_the_fraction_the_servers_run_with():
    assert launch_plan.mem_fraction() == launch_plan.SMOKE_MEM_FRACTION == 0.7
    assert launch_plan.mem_fraction(("--mem-fraction-static", "0.12")) == 0.12  # the last one given wins
    assert launch_plan.mem_fraction(("--mem-fraction-static=0.7",)) == 0.7
    assert launch_plan.launch_parallelism(11, 139 * 1024, fraction=0.12) == 5
    assert launch_plan.launch_parallelism(11, 139 * 1024) == 11


def test_the_launch_budget_divides_the_suite_by_the_first_wave_s_median_launch(tmp_path):
    spec = smoke_servers.SMOKE_SERVERS[0]
    runs = {
        f"s{i}": smoke.SmokeRun(spec=spec, log_path=tmp_path / f"s{i}.log", launch_seconds=t)
        for i, t in enumerate((140.0, 138.0, None, 139.0, 55.0))
    }
    budget = launch_plan.launch_budget(runs, first_wave=4, suite_seconds=210.0)
    assert budget["cold_launches"] == [138.0, 139.0, 140.0]  # the failed launch has none; the 5th was warm
    assert budget["cold_launch_seconds"] == 139.0 and budget["ratio"] == 1.51
    assert "OVER" in launch_plan.launch_budget_line(budget)
    assert "within" in launch_plan.launch_budget_line(launch_plan.launch_budget(runs, 4, 208.0))
    assert launch_plan.launch_budget({}, 1, 5.0)["ratio"] is None
    runs["s0"].first_attempt_error = "CheckFailure: launch ..."  # relaunched alone: timed alone, not in the wave
    assert launch_plan.launch_budget(runs, 4, 210.0)["cold_launches"] == [138.0, 139.0]
    planned = launch_plan.launch_budget(runs, 4, 210.0, free_mib=80_123, fraction=0.42)
    assert (planned["gpu_free_mib"], planned["mem_fraction_static"]) == (80_123, 0.42)
    assert "4 launched at once (0.42 x 80123 MiB free / 2944 MiB)" in launch_plan.launch_budget_line(planned)


def test_launch_parallelism_requested_wins():
    assert launch_plan.launch_parallelism(5, 140 * 1024, 1) == 1
    assert launch_plan.launch_parallelism(3, None, 8) == 3


def test_smoke_options_defaults_and_values():
    assert smoke_servers.smoke_options({}) == smoke_servers.SmokeOptions()
    opts = smoke_servers.smoke_options(
        {
            "MTPMATRIX_SMOKE_PAIR": "moe-26b-a4b",
            "MTPMATRIX_SMOKE_TP": "2",
            "MTPMATRIX_SMOKE_SERVERS": "random-nomtp, random-mtp-topk3",
            "MTPMATRIX_SMOKE_PARALLEL": "3",
            "MTPMATRIX_SMOKE_EXTRA_ARGS": "--enable-deterministic-inference --foo 'a b'",
            "MTPMATRIX_SMOKE_SWAP_DRAFTERS": "1",
        }
    )
    assert (opts.pair, opts.tp, opts.parallel, opts.swap_drafters) == ("moe-26b-a4b", 2, 3, True)
    assert [s.name for s in opts.specs] == ["random-nomtp", "random-mtp-topk3"]  # spec order, not env order
    assert opts.extra_args == ("--enable-deterministic-inference", "--foo", "a b")


@pytest.mark.parametrize(
    "env,match",
    [
        ({"MTPMATRIX_SMOKE_PAIR": "gemma-99b"}, "MTPMATRIX_SMOKE_PAIR='gemma-99b' is not a tiny pair; known: e-series"),
        ({"MTPMATRIX_SMOKE_TP": "two"}, "MTPMATRIX_SMOKE_TP must be a whole number >= 1, got 'two'"),
        ({"MTPMATRIX_SMOKE_TP": "0"}, "MTPMATRIX_SMOKE_TP must be a whole number"),
        ({"MTPMATRIX_SMOKE_PARALLEL": "-2"}, "MTPMATRIX_SMOKE_PARALLEL must be a whole number"),
        (
            {"MTPMATRIX_SMOKE_SERVERS": "random-nomtp,random-mtp-topk2"},
            "unknown server\\(s\\) random-mtp-topk2; known:",
        ),
        ({"MTPMATRIX_SMOKE_EXTRA_ARGS": "--foo 'unclosed"}, "does not split like shell words"),
        ({"MTPMATRIX_SMOKE_EXTRA_ARGS": "--port=1 --tp-size 4"}, "may not set --port=1, --tp-size"),
    ],
)
def test_smoke_options_reject_bad_values_in_one_line(env, match):
    with pytest.raises(ValueError, match=match) as info:
        smoke_servers.smoke_options(env)
    assert "\n" not in str(info.value)


def test_bad_smoke_knob_stops_pytest_before_collection(tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MTPMATRIX_SMOKE_PAIR": "gemma-99b", "PYTHONPATH": str(repo / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/tiers/test_smoke.py", "--tiers", "smoke", "-p", "no:cacheprovider"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 4  # pytest's usage error
    assert "MTPMATRIX_SMOKE_PAIR='gemma-99b' is not a tiny pair" in out.stderr
    env_other = {**env, "MTPMATRIX_TIERS": "contract"}  # smoke not selected: the knob does not matter
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/tiers/test_smoke.py", "-q", "-p", "no:cacheprovider"],
        cwd=repo,
        env=env_other,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "skipped" in out.stdout, out.stdout + out.stderr


def test_default_suite_gates_with_the_sglang_phase_witness():
    specs = {s.name: s for s in smoke_servers.smoke_options({}).specs}
    gate = [specs[n] for n in smoke_servers.WITNESS_SERVERS]
    assert all(s.pair == "witness-sglang-phase" and s.exact and not s.phase_reference for s in gate)
    assert {s.topk for s in gate} == {1, 3}
    probe = [s for s in specs.values() if s.phase_reference]
    assert [s.pair for s in probe] == ["witness"] and probe[0].exact  # output still checked token for token
    assert not any(n.startswith("constructed-") for n in specs)  # on demand: the witness is exact too
    opts = smoke_servers.smoke_options({"MTPMATRIX_SMOKE_SERVERS": "constructed-mtp-topk3"})
    assert [s.name for s in opts.specs] == ["constructed-mtp-topk3"] and opts.specs[0].exact


def test_known_sglang_draft_phase_entry_matches_the_check_message():
    from mtpmatrix.core import known_upstream

    entry = next(k for k in known_upstream.load() if k.id == "sglang-gemma4-mtp-draft-rope-phase")
    failure = {
        "id": "tests/tiers/test_smoke.py::test_draft_phase_matches_transformers[witness-transformers-phase-topk1]",
        "outcome": "failed",
        "metrics": {"accept_length_requests": 1.04},
        "failure": {
            "kind": "acceptance",
            "type": "CheckFailure",
            "message": "draft query is not at transformers' RoPE phase: the transformers-phase witness accepts "
            "1.04 per verify (floor 5.0)",
        },
    }
    gate = [
        {"id": f"tests/tiers/test_smoke.py::{name}", "outcome": "passed"} for name in entry.signature["passed_beside"]
    ]
    assert entry.tier == "smoke" and entry.serving_path and entry.component == "sglang"
    assert entry.matches(failure, [failure, *gate])
    # the message alone is not the bug: without the sglang-phase witness passing beside it, it is something else
    assert not entry.matches(failure, [failure])
    assert entry.applies_to({"sglang": "0.5.17"}) and not entry.applies_to({"sglang": "0.5.24"})
    assert not entry.matches(
        dict(failure, failure={"kind": "acceptance", "message": "accept length 1.04 outside [5.0, 6]"}),
        [failure, *gate],
    )
    # the releases known to deviate are the releases the gate witness is built off the reference phase for
    from mtpmatrix.pairs.witness.phase import REFERENCE_DRAFT_PHASE, SGLANG_DRAFT_PHASES

    off_reference = [spec for spec, phase in SGLANG_DRAFT_PHASES if phase != REFERENCE_DRAFT_PHASE]
    assert off_reference == [entry.affected]


def test_max_running_requests_reads_both_log_spellings():
    log = (
        "Decode batch. #running-req: 3, #token: 40\n"
        "Prefill batch. #new-seq: 4, #running-req=7, x\nDecode batch. #running-req: 5, #token: 90\n"
    )
    assert smoke.max_running_requests(log) == 7
    assert smoke.max_running_requests("no batches logged") == 0


def test_server_accept_bounds_from_request_counters():
    # 2 requests of 32 tokens, 6 verify steps each: 31 accepted tokens each -> [62/12, (62 + 2*5)/12]
    metas = [{"completion_tokens": 32, "spec_verify_ct": 6}] * 2
    lo, hi = meta_fields.server_accept_bounds(metas, steps=5)
    assert (lo, hi) == (round(62 / 12, 4), 6.0)
    assert meta_fields.server_accept_bounds([{"completion_tokens": 32, "spec_verify_ct": 31}], steps=5) == (1.0, 1.1613)
    assert meta_fields.server_accept_bounds([{"completion_tokens": 5}], steps=5) is None  # no speculative decoding ran


# --- accept-length floors (issue: floors that can fail) ----------------------------------------------------------
def _metas(verify_steps, completion=smoke.MAX_NEW_TOKENS):
    return [{"completion_tokens": completion, "spec_verify_ct": v} for v in verify_steps]


def test_exact_pair_floor_is_what_an_intact_path_reaches_exactly():
    # 32 tokens: 1 from prefill, 31 over verify steps keeping at most NUM_STEPS + 1 = 6 -> 6 steps, 32 / 6
    assert smoke.all_drafts_accepted_length(32, 5) == 32 / 6
    assert smoke.EXACT_PAIR_ACCEPT_LENGTH == smoke.all_drafts_accepted_length(smoke.MAX_NEW_TOKENS, settings.NUM_STEPS)
    intact = client.accept_length_from_meta(_metas([6] * smoke.N_ID_PROMPTS))  # 5.3333: every run in docs/runs
    one_draft_lost = client.accept_length_from_meta(_metas([6] * (smoke.N_ID_PROMPTS - 1) + [7]))  # 256 / 49
    for topk in settings.TOPKS:
        floor = smoke.EXACT_PAIR_MIN_ACCEPT[topk]
        assert intact >= floor > one_draft_lost  # one draft lost in 8 requests is below it, at topk 1 and 3
        assert floor > 3.507  # the best-accepting mutant in docs/runs/2026-11-30d-*-mutants.json.gz


def test_exact_pair_losing_a_draft_fails_and_says_why():
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk3")
    assert smoke.accept_length_problem(spec, _metas([6] * 8)) is None
    problem = smoke.accept_length_problem(spec, _metas([6] * 7 + [7]))
    assert problem.startswith("accept length 5.2245 outside [5.3333, 5.3333]: an intact path accepts every draft")


def test_random_pair_is_a_presence_check_that_can_fail():
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "random-mtp-topk3")
    # every draft rejected: 31 verify steps for 31 tokens; speculative decoding ran, which is all it says
    assert smoke.accept_length_problem(spec, _metas([31] * 8)) is None
    assert smoke.accept_length_problem(spec, []) == (
        "responses carry no spec_verify_ct (speculative decoding did not run)"
    )
    # one request served without a verify step: the pooled value (1.03) alone would hide it
    assert smoke.accept_length_problem(spec, _metas([31] * 7 + [0])) == (
        "1/8 responses ran no verify step: speculative decoding did not run for them"
    )
    # more than any drafter can accept: the counters are wrong
    assert smoke.accept_length_problem(spec, _metas([4] * 8)).startswith("accept length 8.0 outside [1.0, 5.3333]")
