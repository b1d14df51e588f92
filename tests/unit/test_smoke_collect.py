"""smoke_collect.py against tests/unit/fake_sglang.py processes (lifecycle only, never tier evidence): servers side by
side, crashes named by their root exception, interrupts, relaunching a failure alone, and which requests go alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client
from mtpmatrix.tiers import smoke, smoke_collect

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
