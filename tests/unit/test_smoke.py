"""smoke.py's pure parts: graph-capture log lines (as sglang 0.5.13 / 0.5.17 printed them on an H200), prompts,
the constructed-pair rule, accept length from meta_info, and the near-tie judgement of divergences."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client, launch_plan
from mtpmatrix.tiers import smoke, smoke_collect
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


# --- side-by-side collection (against tests/unit/fake_sglang.py processes; lifecycle only, never tier evidence)
FAKE = str(Path(__file__).with_name("fake_sglang.py"))


def _collect_on_fake(tmp_path, spec, *fake_args):
    """smoke_collect.collect of ``spec`` against the fake server (tests/unit/fake_sglang.py with ``fake_args``)."""
    import sys

    return smoke_collect.collect(
        smoke.SmokeJob(spec, tmp_path / "target", tmp_path / "assistant", vocab_size=512),
        smoke_collect.ServerOptions(log_dir=tmp_path, launcher=[sys.executable, FAKE, *fake_args]),
    )


def _jobs(tmp_path, n=3):
    return [
        smoke.SmokeJob(spec, tmp_path / "target", tmp_path / "assistant", vocab_size=512)
        for spec in smoke_servers.SMOKE_SERVERS[:n]
    ]


@pytest.mark.parametrize(
    "free_mib,want",
    [(None, 1), (0, 1), (8 * 1024, 1), (24 * 1024, 3), (48 * 1024, 5), (80 * 1024, 5), (140 * 1024, 5), (10**7, 5)],
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


def test_an_idle_h200_launches_the_default_servers_in_one_wave():
    """What the README states: an idle H200 (143,771 MiB = 140.4 GiB, docs/runs/env-2-r17.txt; about 125-139 GiB
    free once the driver has its share) launches all default servers at once."""
    for free_gib in (125, 139):
        assert launch_plan.launch_parallelism(len(smoke_servers.DEFAULT_SMOKE_SERVERS), free_gib * 1024) == len(
            smoke_servers.DEFAULT_SMOKE_SERVERS
        )
    assert launch_plan.launch_parallelism(len(smoke_servers.DEFAULT_SMOKE_SERVERS), 24 * 1024) == 3


def test_the_wave_follows_the_fraction_the_servers_run_with():
    assert launch_plan.mem_fraction() == launch_plan.SMOKE_MEM_FRACTION == 0.42
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


def test_collect_all_side_by_side(tmp_path):
    import sys

    said = []
    # each stub binds its port only once all three stubs run at once (a rendezvous): launched in turn, the first
    # would wait alone and exit 1 ("rendezvous: ..."), failing its run
    side_by_side = [sys.executable, FAKE, "--rendezvous", str(tmp_path / "running"), "--rendezvous-count", "3"]
    options = smoke_collect.ServerOptions(log_dir=tmp_path, launcher=side_by_side, progress=said.append)
    runs = smoke_collect.collect_all(_jobs(tmp_path), options, parallel=3)
    # progress while it runs: which server, how many are done, how long each took to get ready
    assert said[0] == "[smoke] launching 3 sglang server(s), 3 side by side"
    collected = sorted(ln.split(": ")[0] for ln in said if "collected" in ln)
    assert collected == [f"[smoke] {i}/3 collected" for i in (1, 2, 3)]
    assert sum(" ready after " in ln and ln.startswith("[random-") for ln in said) == 3  # SglangServer's own lines
    assert list(runs) == [s.name for s in smoke_servers.SMOKE_SERVERS[:3]]  # job order, whatever finished first
    for run in runs.values():
        assert run.error is None, run.error
        assert run.launch_seconds is not None and run.server_info_before is not None
        assert len(run.id_outputs) == smoke.N_ID_PROMPTS and all(run.text_outputs)
        assert run.first_attempt_error is None
        assert "# command: " in run.log_text


def test_a_server_that_dies_mid_request_is_a_crash_naming_its_root_exception(tmp_path):
    run = _collect_on_fake(tmp_path, smoke_servers.SMOKE_SERVERS[0], "--crash-on-generate")
    assert isinstance(run.error, CheckFailure) and run.error.kind == "crash"
    first = str(run.error).splitlines()[0]
    # the requests only saw the connection go; the server log says why (what a known-upstream signature matches)
    assert "requests failed: " in first and "Connection" in first
    assert first.endswith("; server log: RuntimeError: injected scheduler crash (--crash-on-generate)")


def test_a_family_that_can_kill_the_server_goes_last_and_costs_only_its_mixed_batch(tmp_path):
    # sglang 0.5.17 dies on a token_ids_logprob request in a mixed batch (H200, 2026-12-05): every other family and
    # the tier's own /server_info read come first, then the all-asking batch (answered: the fake crashes on the
    # fourth asking request, the mixed batch's); only the mixed batch's requests fail, each naming the log's cause
    from mtpmatrix.tiers.surface import token_ids_logprob as ids

    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-nomtp")
    run = _collect_on_fake(tmp_path, spec, "--crash-on-key", "token_ids_logprob", "--crash-after", "3")
    assert run.error is None and run.server_info_after is not None
    assert run.sent_after_info == {ids.NAME}
    family = {x.label: x for x in run.exchanges(ids.NAME)}
    assert set(family) == ids.LAST_FIRST | ids.MIXED
    assert not [label for label in ids.LAST_FIRST if family[label].error]
    cause = "; server log: RuntimeError: injected scheduler crash (--crash-on-generate)"
    assert (family[f"mixed-{ids.MIXED_ASKING}"].error or "").endswith(cause)
    # its neighbours in the fake may be answered before it lands (sglang loses every request in flight)
    assert all(family[label].error is None or family[label].error.endswith(cause) for label in ids.MIXED)
    others = [x for name, xs in run.surface.items() if name != ids.NAME for x in xs]
    assert len(others) > 20 and not [x.error for x in others if x.error and "Connection" in x.error]
    assert len(run.info_meta) + sum(len(x.metas) for x in family.values()) == len(run.all_meta)


def test_a_server_dead_in_the_last_batch_is_stopped_at_its_log_line_not_its_own_kill(tmp_path):
    # sglang 0.5.17's launcher logs SIGQUIT at once, then holds the crashed batch's requests through a 60 s coredump
    # wait (H200, 2026-12-05: the suite 60 s longer per witness server); the collection stops it at the log line
    from mtpmatrix.tiers.surface import token_ids_logprob as ids

    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-nomtp")
    args = ("--crash-on-key", "token_ids_logprob", "--crash-after", "3", "--crash-holds")
    run = _collect_on_fake(tmp_path, spec, *args)
    family = {x.label: x for x in run.exchanges(ids.NAME)}
    cause = "; server log: RuntimeError: injected scheduler crash (--crash-on-generate)"
    assert (family[f"mixed-{ids.MIXED_ASKING}"].error or "").endswith(cause)
    assert "released by no one" not in run.log_text  # stopped at the SIGQUIT line, not after the hold


def test_the_cause_is_read_once_the_launcher_logs_the_failure_not_at_its_exit(tmp_path):
    # sglang 0.5.13's launcher logs SIGQUIT, then waits 60 s for CUDA coredumps before it exits: the cause is read
    # at the SIGQUIT line; this stub never exits on its own, so a harness waiting for the exit would get nothing
    run = _collect_on_fake(tmp_path, smoke_servers.SMOKE_SERVERS[0], "--crash-on-generate", "--crash-stays")
    first = str(run.error).splitlines()[0]
    assert run.error.kind == "crash" and "requests failed: " in first
    assert first.endswith("; server log: RuntimeError: injected scheduler crash (--crash-on-generate)")


def test_failure_beside_others_is_relaunched_alone(tmp_path):
    import sys

    flag = tmp_path / "fail-once"
    flag.touch()
    options = smoke_collect.ServerOptions(log_dir=tmp_path, launcher=[sys.executable, FAKE, "--exit-once", str(flag)])
    runs = smoke_collect.collect_all(_jobs(tmp_path), options, parallel=3)
    relaunched = [r for r in runs.values() if r.first_attempt_error]
    assert len(relaunched) == 1 and "exited with code 1" in relaunched[0].first_attempt_error
    assert all(r.error is None for r in runs.values())
    assert relaunched[0].log_path.name.endswith("-alone.log")
    assert (tmp_path / relaunched[0].log_path.name.replace("-alone", "")).exists()  # first attempt's log is kept


def test_failure_alone_is_not_retried(tmp_path):
    import sys

    flag = tmp_path / "fail-once"
    flag.touch()
    options = smoke_collect.ServerOptions(log_dir=tmp_path, launcher=[sys.executable, FAKE, "--exit-once", str(flag)])
    runs = smoke_collect.collect_all(_jobs(tmp_path, 1), options, parallel=1)
    (run,) = runs.values()
    assert run.error is not None and run.first_attempt_error is None
    assert "injected launch failure" in str(run.error)


def test_interrupt_stops_every_server(tmp_path, monkeypatch):
    import os
    import signal
    import sys
    import threading

    from events import HANG

    from mtpmatrix.serving.processes import group_members
    from mtpmatrix.serving.server import SglangServer

    seen: list[SglangServer] = []
    lock = threading.Lock()
    real_start = SglangServer.start

    def start(self):
        real_start(self)
        with lock:
            seen.append(self)
            all_three = len(seen) == 3
        if all_three:  # SIGINT the test process (as tools/gpu_box.sh's timeout does) once all three processes exist
            os.kill(os.getpid(), signal.SIGINT)
        return self

    monkeypatch.setattr(SglangServer, "start", start)
    # Python leaves SIGINT ignored when it started ignored (a background job of a non-interactive shell): make it
    # raise KeyboardInterrupt here whatever launched the test run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    said: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):  # servers answer but never become ready
            smoke_collect.collect_all(
                _jobs(tmp_path),
                smoke_collect.ServerOptions(
                    log_dir=tmp_path,
                    ready_timeout=HANG,
                    progress=said.append,
                    launcher=[sys.executable, FAKE, "--ready-file", str(tmp_path / "never")],
                ),
                parallel=3,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(seen) == 3
    assert all(not group_members(s.pid) for s in seen)
    # stopped at the interrupt: no server waited out its ready timeout
    assert not [ln for ln in said if "giving up" in ln], said


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
        assert floor > 3.507  # the best-accepting mutant in docs/runs/2026-11-30d-*-mutants.json


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


# --- relaunching alone (issue: a verdict in one launch) ------------------------------------------------------------
def test_failure_that_repeats_alone_stands_for_the_others(tmp_path):
    """A broken release: every server fails side by side; the first, relaunched alone, fails the same way, so the
    others are not relaunched in turn (five relaunches ran a GPU box into its time limit with no verdict)."""
    import sys

    said = []
    runs = smoke_collect.collect_all(
        _jobs(tmp_path),
        smoke_collect.ServerOptions(
            log_dir=tmp_path, launcher=[sys.executable, FAKE, "--exit-always"], progress=said.append
        ),
        parallel=3,
    )
    first, *others = runs.values()
    assert sorted(p.name for p in tmp_path.glob("*-alone.log")) == [f"server-{first.spec.name}-alone.log"]
    assert first.log_path.name.endswith("-alone.log") and "exited with code 1" in first.first_attempt_error
    assert isinstance(first.error, CheckFailure) and first.error.kind == "launch"
    for run in others:
        assert run.error.kind == "launch" and run.first_attempt_error is None
        assert run.confirmed_alone_by == first.spec.name
        head = str(run.error).splitlines()[0]
        assert head.endswith(
            f"[not relaunched alone: {first.spec.name} failed the same way alone, {first.log_path.name}]"
        )
    assert sum("not relaunched alone" in ln for ln in said) == 2


def test_failure_signature_ignores_server_names_and_numbers():
    a = CheckFailure(
        "launch",
        "random-nomtp server exited with code 1 before it was ready (35s after "
        "launch): RuntimeError: capture failed at port 30012\nlog: x",
    )
    b = CheckFailure(
        "launch",
        "witness-mtp-topk3 server exited with code 1 before it was ready (41s after "
        "launch): RuntimeError: capture failed at port 30020\nlog: y",
    )
    assert smoke.failure_signature(a, "random-nomtp") == smoke.failure_signature(b, "witness-mtp-topk3")
    other = CheckFailure(
        "launch",
        "witness-mtp-topk3 server exited with code 1 before it was ready (41s "
        "after launch): torch.OutOfMemoryError: CUDA out of memory",
    )
    assert smoke.failure_signature(other, "witness-mtp-topk3") != smoke.failure_signature(a, "random-nomtp")
    assert smoke.failure_signature(RuntimeError("port in use"), "random-nomtp") is None  # not a server's failure


def test_sampled_servers_get_the_sampled_plan_besides_the_greedy_requests(tmp_path):
    """A sampled-pair server is sent the greedy requests and the sampled plan, and each answer lands in its own list
    (lifecycle only: the fake server's outputs say nothing about distributions)."""
    from mtpmatrix.pairs.sampled import ring

    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "sampled-mtp-topk1")
    assert {s.name for s in smoke_servers.DEFAULT_SMOKE_SERVERS} >= {
        "sampled-nomtp",
        "sampled-mtp-topk1",
        "sampled-mtp-topk3",
    }
    run = _collect_on_fake(tmp_path, spec)
    assert run.error is None, run.error
    assert len(run.id_outputs) == smoke.N_ID_PROMPTS and len(run.text_outputs) == len(smoke.TEXT_PROMPTS)
    assert run.sampled_requests == ring.request_plan()
    assert len(run.sampled_outputs) == len(run.sampled_meta) == ring.N_REQUESTS
    assert smoke.sampled_plan(smoke_servers.SMOKE_SERVERS[0]) == []  # other pairs: greedy requests only


def test_decoy_servers_are_exact_and_predicted():
    specs = {s.name: s for s in smoke_servers.SMOKE_SERVERS}
    decoys = [specs[n] for n in smoke_servers.DECOY_SERVERS]
    assert all(s.pair == "decoy-sglang-phase" and s.exact and s.decoy and not s.phase_reference for s in decoys)
    assert {s.topk for s in decoys} == {1, 3}
    assert all(s.default == smoke_servers.DECOY_IN_DEFAULT_SUITE for s in decoys)
    # besides them, only a server of another scheduler or graph mode serves the decoy
    assert all(s.mode_args for s in specs.values() if s.decoy and s.name not in smoke_servers.DECOY_SERVERS)


def _issue(**kw):
    from mtpmatrix.core.known_upstream import KnownIssue

    base = dict(
        id="sglang-x-crash",
        package="sglang",
        affected=">=0.5.13,<0.5.17",
        tier="smoke",
        component="sglang",
        kind="launch",
        match=r"server exited with code -?\d+ before it was ready \(\d+s after launch\): RuntimeError: shape \(384\)",
        checks=("test_server_serves[srv-a]", "test_spec_metrics[srv-a]"),
        summary="s",
        upstream="u",
    )
    return KnownIssue(**{**base, **kw})


CRASH = CheckFailure(
    "launch",
    "srv-a server exited with code -9 before it was ready (48s after launch): RuntimeError: "
    "shape (384)\nlog: x\n--- last 40 log lines ---\n...",
)


def test_a_failure_a_known_entry_describes_is_not_relaunched():
    v13, v17 = {"sglang": "0.5.13"}, {"sglang": "0.5.17"}
    assert smoke.known_to_fail_alone(CRASH, "srv-a", v13, [_issue()]) == "sglang-x-crash"
    # anything short of the entry's launch-time signature: relaunched as usual
    assert smoke.known_to_fail_alone(CRASH, "srv-a", v17, [_issue()]) is None  # another release
    assert smoke.known_to_fail_alone(CRASH, "srv-b", v13, [_issue()]) is None  # another server
    assert smoke.known_to_fail_alone(CRASH, "srv-a", v13, [_issue(kind="crash")]) is None
    assert smoke.known_to_fail_alone(CRASH, "srv-a", v13, [_issue(checks=("test_spec_metrics[srv-a]",))]) is None
    other = CheckFailure("launch", "srv-a server exited with code -9 before it was ready (48s after launch): OOM")
    assert smoke.known_to_fail_alone(other, "srv-a", v13, [_issue()]) is None
    assert smoke.known_to_fail_alone(RuntimeError("x"), "srv-a", v13, [_issue()]) is None


def test_collect_all_keeps_a_known_failure_without_the_relaunch(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(smoke, "known_to_fail_alone", lambda err, server, versions: "sglang-x-crash")
    said = []
    runs = smoke_collect.collect_all(
        _jobs(tmp_path, 2),
        smoke_collect.ServerOptions(
            log_dir=tmp_path, launcher=[sys.executable, FAKE, "--exit-always"], progress=said.append
        ),
        parallel=2,
    )
    assert all(r.error is not None and r.known_upstream_no_relaunch == "sglang-x-crash" for r in runs.values())
    assert not list(tmp_path.glob("*-alone.log")) and not any(r.first_attempt_error for r in runs.values())
    assert sum("not relaunched alone (failed as sglang-x-crash does)" in ln for ln in said) == 2


def _collect_witness_recording_batches(tmp_path, monkeypatch, *fake_args):
    """smoke_collect.collect on witness-mtp-topk1 against the fake server, and the client batches it sent, in order:
    (payloads, parallel) each."""
    from mtpmatrix.serving import client

    batches = []
    real_run_batch = client.run_batch

    def recording_run_batch(base_url, requests, parallel=128, **kw):
        requests = list(requests)
        batches.append((requests, parallel))
        return real_run_batch(base_url, requests, parallel=parallel, **kw)

    monkeypatch.setattr(client, "run_batch", recording_run_batch)
    spec = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk1")
    run = _collect_on_fake(tmp_path, spec, *fake_args)
    return run, batches


def test_penalty_requests_go_alone_after_the_shared_batch(tmp_path, monkeypatch):
    """A witness server's penalty requests (features.ALONE) are sent after every other request, one at a time (a
    client batch of parallel 1 of its own, after the shared batch returned), and no other request was in flight at
    any moment of theirs (the fake counts). Lifecycle only: the fake's outputs say nothing about penalties."""
    from mtpmatrix.tiers.surface import features, token_ids_logprob

    assert features.ALONE == {
        "frequency-penalty-plus",
        "frequency-penalty-minus",
        "presence-penalty-plus",
        "presence-penalty-minus",
        "repetition-penalty-2",
        "repetition-boost",
    }
    alone_payloads = [
        features._witness_payload(label) for label in features.WITNESS_FEATURES if label in features.ALONE
    ]
    run, batches = _collect_witness_recording_batches(tmp_path, monkeypatch)
    assert run.error is None, run.error
    (shared, parallel), (alone, alone_parallel), (asking, _p1), (mixed, _p2) = batches
    assert parallel > 1 and not any(p in shared for p in alone_payloads)
    assert (alone, alone_parallel) == (alone_payloads, 1)
    # then the family that can kill a release's server (surface LAST): its all-asking batch, then its mixed one
    planned = dict(token_ids_logprob.requests(run.spec, 512))
    assert asking == [planned[label] for label in planned if label in token_ids_logprob.LAST_FIRST]
    assert mixed == [planned[label] for label in planned if label in token_ids_logprob.MIXED]
    by_label = {x.label: x for x in run.exchanges(features.NAME)}
    assert set(by_label) == set(features.WITNESS_FEATURES)
    assert {label: by_label[label].meta["fake_peers"] for label in features.ALONE} == dict.fromkeys(features.ALONE, 0)
    # each answer is the one to its own payload, also for the requests sent apart
    assert all(x.payload == features._witness_payload(x.label) for x in by_label.values())


def test_no_request_goes_alone_to_a_server_that_lost_a_connection(tmp_path, monkeypatch):
    """sglang 0.5.13's server whose scheduler died keeps its HTTP port open for 60 s (the launcher's coredump wait):
    a request sent there waits for the kill. Seen on the H200 (2026-12-02, witness-mtp-topk3-eager): the penalty
    requests sent one by one to it after the crash held the suite 59 s longer (1.58 x one cold launch, 1.34 before).
    After a lost connection none is sent; each is kept with why."""
    from mtpmatrix.tiers.surface import features

    run, batches = _collect_witness_recording_batches(tmp_path, monkeypatch, "--crash-on-generate", "--crash-stays")
    assert run.error.kind == "crash" and len(batches) == 1  # the shared batch only
    alone = [x for x in run.exchanges(features.NAME) if x.label in features.ALONE]
    assert len(alone) == len(features.ALONE)
    assert all(x.error.startswith("not sent: the server lost a connection in the batch before (") for x in alone)
