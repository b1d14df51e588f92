"""Collecting the smoke tier's servers: one server's life (launch, wait until ready, the requests, what came back,
stop) and the waves that run several side by side, relaunching alone what failed beside the others.

mtpmatrix.tiers.smoke says what a server is sent and judges what came back; this module only runs the servers and
keeps their answers in a SmokeRun each. A server that fails while others share the GPU is relaunched alone before
its failure counts, so contention never becomes a verdict; a failure that repeats alone stands for every server that
failed the same way beside it (``smoke.failure_signature``), so a broken release costs one relaunch, not one per
server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client, environment
from mtpmatrix.serving.server import SglangServer
from mtpmatrix.tiers import smoke, surface
from mtpmatrix.tiers.smoke import SmokeJob, SmokeRun

# Requests in flight per server: twice the servers' --max-running-requests (SMOKE_ARGS: 8), so the scheduler always
# has a full batch queued (topk 3 must batch >= WITNESS_MIN_BATCH) without 76 connections opened at once for the
# sampled plan (H200, sglang 0.5.17: 68/76 such requests came back RemoteDisconnected while the server stalled).
CLIENT_PARALLEL = 16
# a request error that says the server went away (client.RequestResult.error text)
CONNECTION_LOST = ("ConnectionError", "RemoteDisconnected", "Connection refused", "Connection reset")


@dataclass(frozen=True)
class ServerOptions:
    """How every server of one collection launches: where its log goes, at which TP size, with which interpreter and
    extra sglang arguments (MTPMATRIX_SMOKE_EXTRA_ARGS, last, so they win), how long it may take to get ready, and
    who hears the progress lines."""

    log_dir: Path
    tp: int = 1
    python: str = sys.executable
    ready_timeout: float = 420.0
    extra_args: tuple[str, ...] = ()
    launcher: list[str] | None = None  # replaces ``python -m sglang.launch_server`` (unit tests only)
    progress: Callable[[str], None] | None = None


def collect_all(jobs: list[SmokeJob], options: ServerOptions, *, parallel: int = 1) -> dict[str, SmokeRun]:
    """Collect every job, ``parallel`` servers at a time; relaunch alone any that failed beside others, except one
    that failed like a server whose relaunch alone failed the same way (that failure stands for it).

    Ctrl-C (or the SIGINT of tools/gpu_box.sh's timeout) stops every running server's process group before it
    propagates. ``options.progress(line)`` hears each server's launch and readiness and one line per server
    collected. Returns runs by server name, in job order.
    """
    collection = _Collection(jobs, options)
    if options.progress is not None:
        side_by_side = min(max(1, parallel), len(jobs))
        options.progress(f"[smoke] launching {len(jobs)} sglang server(s), {side_by_side} side by side")
    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="smoke")
    try:
        futures = {job.spec.name: pool.submit(collection.one, job, f"server-{job.spec.name}.log") for job in jobs}
        runs = {name: fut.result() for name, fut in futures.items()}
        pool.shutdown(wait=True)
        if parallel > 1 and len(jobs) > 1:
            collection.relaunch_alone(runs)
    except BaseException:
        collection.stop_every_server()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return runs


class _Collection:
    """The servers of one collect_all: every one launched, so that an interrupt can stop them all, and how many have
    been collected, for the progress lines."""

    def __init__(self, jobs: list[SmokeJob], options: ServerOptions):
        self.jobs, self.options = jobs, options
        self.started: list = []  # every SglangServer launched
        self.lock = threading.Lock()
        self.interrupted = threading.Event()
        self.done = 0

    def _remember(self, server) -> None:
        # Under the lock: either the interrupt handler sees this server, or this server sees the interrupt.
        with self.lock:
            self.started.append(server)
            if self.interrupted.is_set():
                raise RuntimeError("smoke collection interrupted")

    def one(self, job: SmokeJob, log_name: str) -> SmokeRun:
        run = collect(job, self.options, log_name=log_name, on_start=self._remember)
        if self.options.progress is not None:
            with self.lock:
                self.done += 1
                n = self.done
            how = "ok" if run.error is None else f"failed: {(str(run.error).splitlines() or [''])[0][:120]}"
            what = "relaunched alone" if log_name.endswith("-alone.log") else f"{n}/{len(self.jobs)} collected"
            self.options.progress(f"[smoke] {what}: {job.spec.name}, ready after {run.launch_seconds or '-'}s, {how}")
        return run

    def relaunch_alone(self, runs: dict[str, SmokeRun]) -> None:
        """Relaunch alone each server that failed beside the others, replacing its run, unless a known-upstream entry
        already describes its failure (smoke.known_to_fail_alone). A failure that repeats alone is no contention: it
        stands for every server that failed the same way beside the others, so a broken release costs one relaunch,
        not one per server."""
        progress = self.options.progress
        confirmed: dict[tuple, SmokeRun] = {}  # failure signature -> the relaunch that failed so alone too
        versions = {"sglang": environment.version_of("sglang")}
        for job in self.jobs:
            first = runs[job.spec.name]
            if first.error is None:
                continue
            known = smoke.known_to_fail_alone(first.error, job.spec.name, versions)
            if known is not None:
                first.known_upstream_no_relaunch = known
                if progress is not None:
                    progress(f"[smoke] {job.spec.name}: not relaunched alone (failed as {known} does)")
                continue
            signature = smoke.failure_signature(first.error, job.spec.name)
            if signature in confirmed:
                _stand_for(first, confirmed[signature], progress)
                continue
            again = self.one(job, f"server-{job.spec.name}-alone.log")
            line = (str(first.error).splitlines() or [""])[0]
            again.first_attempt_error = f"{type(first.error).__name__}: {line}"[:300]
            runs[job.spec.name] = again
            if signature is not None and smoke.failure_signature(again.error, job.spec.name) == signature:
                confirmed[signature] = again

    def stop_every_server(self) -> None:
        self.interrupted.set()
        with self.lock:
            servers = list(self.started)
        for srv in servers:
            srv.stop(timeout=20)


def _stand_for(run: SmokeRun, confirmed: SmokeRun, progress) -> None:
    """Keep ``run``'s failure beside the others as its verdict, pointing at the relaunch that repeated it alone."""
    run.confirmed_alone_by = confirmed.spec.name
    first, _, rest = str(run.error).partition("\n")
    note = f" [not relaunched alone: {confirmed.spec.name} failed the same way alone, {confirmed.log_path.name}]"
    run.error.args = (first + note + ("\n" + rest if rest else ""),)  # same exception: kind and traceback kept
    if progress is not None:
        progress(f"[smoke] {run.spec.name}: not relaunched alone ({confirmed.spec.name} failed the same way alone)")


# --------------------------------------------------------------------------------------------- one server's life
def collect(job: SmokeJob, options: ServerOptions, *, log_name: str | None = None, on_start=None) -> SmokeRun:
    """Launch one server, exercise it, stop it. Never raises: a failure is kept in ``run.error``.

    ``on_start(server)`` is called once the process exists, before waiting for it.
    """
    spec = job.spec
    log_path = Path(options.log_dir) / (log_name or f"server-{spec.name}.log")
    run = SmokeRun(spec=spec, log_path=log_path, vocab_size=job.vocab_size)
    server = SglangServer(
        smoke.server_args_for(spec, job.target, job.assistant, options.tp, options.extra_args),
        python=options.python,
        log_path=run.log_path,
        ready_timeout=options.ready_timeout,
        launcher=options.launcher,
        name=spec.name,
        progress=options.progress,
    )
    try:
        _launch(server, run, on_start)
        last = _exercise(server, run)
        run.server_info_after = server.server_info()
        _exercise_last(server, run, last)
    except KeyboardInterrupt:  # Ctrl-C stops the tier, not just this server
        raise
    except BaseException as exc:  # kept for the tests, which re-raise it with its classification
        run.error = exc
    finally:
        server.stop()  # the whole process group, also when start() or on_start() raised
        run.log_text = run.log_path.read_text(errors="replace") if run.log_path.exists() else ""
    return run


def _launch(server, run: SmokeRun, on_start) -> None:
    """Start the server, tell ``on_start``, wait until it is ready; keep how long that took and what it holds."""
    t0 = time.monotonic()
    server.start()
    if on_start is not None:
        on_start(server)
    server.wait_ready()
    run.launch_seconds = round(time.monotonic() - t0, 1)
    run.gpu_memory_mib = server.gpu_memory_mib()
    run.server_info_before = server.server_info()


def _exercise(server, run: SmokeRun) -> list:
    """Send the tier's own requests and every request family's but the LAST ones (returned, to send once the server
    has been read), keep what came back; a failed request of the tier's own is the server's failure (raised), a
    family's stays with its exchange."""
    t1 = time.monotonic()
    own, plan = _own_requests(run.spec, run.vocab_size)
    rest, last = surface.split_last(surface.requests_for(run.spec, run.vocab_size))
    # every family's requests in the same batch as the rest: mixed request kinds in flight together
    labelled, alone = surface.split_alone(rest)
    results = _send(server, own + [payload for _f, _l, payload in labelled], [payload for _f, _l, payload in alone])
    run.request_seconds = round(time.monotonic() - t1, 2)
    # a family's failed request stays with its exchange: whether the release refuses what it asks is that
    # family's check to judge, not a crash of the whole server
    run.surface = surface.collate(labelled + alone, results[len(own) :])
    results = results[: len(own)]
    _raise_on_failed(server, results)
    _keep_answers(run, results, plan)
    return last


def _exercise_last(server, run: SmokeRun, last: list) -> None:
    """Send the LAST families' requests in their batches (surface.last_batches) and keep what came back beside the
    others'; none after a batch that lost the server, and when the connection went with it, each failed request's
    error names the server log's cause, the signature a known-upstream entry matches."""
    if not last:
        return
    sent, results = [], []
    for batch in surface.last_batches(last):
        if _went_with_server(server, results):
            # not the batch before's error: its cause is that batch's signature, not this one's
            got = _not_sent(len(results), len(batch), "not sent: the server died in the batch before")
        else:
            got = _run_watching(server, [p for _f, _l, p in batch])
            _name_the_cause(server, got)
        sent += batch
        results += got
    for family, exchanges in surface.collate(sent, results).items():
        run.surface[family] = exchanges
    run.sent_after_info = frozenset(f for f, _l, _p in last)


# How long a server whose child failed gets to end on SIGTERM before SIGKILL: it is dead already, and sglang's
# launcher answers SIGTERM only after its 60 s coredump wait (H200, 0.5.17, 2026-12-05: the mixed token_ids_logprob
# batch held the suite 60 s per witness server, ratio 1.85).
DEAD_SERVER_GRACE_S = 5.0


def _run_watching(server, payloads: list) -> list:
    """client.run_batch of ``payloads``, stopping the server (which drops their connections) as soon as its log says
    a child failed: the LAST families can kill it, and a dead sglang holds its open requests until its own kill."""
    box: dict = {}

    def send() -> None:
        try:
            box["results"] = client.run_batch(server.base_url, payloads, parallel=min(len(payloads), CLIENT_PARALLEL))
        except BaseException as exc:  # raised here, in the collecting thread
            box["error"] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        if thread.is_alive() and server.child_failed():
            server.stop(grace=DEAD_SERVER_GRACE_S)
            thread.join()
    if "error" in box:
        raise box["error"]
    return box["results"]


def _went_with_server(server, results: list) -> bool:
    """Whether a request of ``results`` failed and the server went with it: it exited, or a failed request lost its
    connection (its log then names why)."""
    errors = [r.error for r in results if r.error]
    return bool(errors) and (not server.alive() or any(lost in e for e in errors for lost in CONNECTION_LOST))


def _not_sent(first_index: int, n: int, why: str) -> list:
    """The results of ``n`` requests not sent, each saying ``why``."""
    return [client.Result(first_index + i, False, 0.0, error=why) for i in range(n)]


def _name_the_cause(server, results: list) -> None:
    """When ``results`` lost their connection with the server, each failed one's error names the log's cause."""
    cause = server.exit_cause() if _went_with_server(server, results) else ""
    for r in results:
        if cause and r.error:
            r.error = f"{r.error}; server log: {cause}"


def _own_requests(spec, vocab_size: int) -> tuple[list[dict], list]:
    """The tier's own requests, in the order _keep_answers reads their answers (token ids, text, the sampled pair's
    plan), and that plan."""
    # The no-MTP reference also returns its top logprobs, to tell near-ties from real divergences.
    logprob_args = {} if spec.topk else {"return_logprob": True, "top_logprobs_num": smoke.TOP_LOGPROBS}
    reqs = [
        {"input_ids": p, "sampling_params": smoke.sampling_params(), **logprob_args}
        for p in smoke.id_prompts(vocab_size)
    ]
    reqs += [{"text": t, "sampling_params": smoke.sampling_params()} for t in smoke.TEXT_PROMPTS]
    plan = smoke.sampled_plan(spec)
    if plan:
        from mtpmatrix.pairs.sampled.ring import payload

        reqs += [payload(r) for r in plan]
    return reqs, plan


def _send(server, batch: list[dict], alone: list[dict]) -> list:
    """The results of ``batch`` (sent side by side), then of ``alone``, sent one at a time with nothing else in flight
    (answers that depend on the batches beside them); never to a server that lost a connection (a dying sglang may
    hold a request until its launcher's kill: 60 s on 0.5.13), whose results say so instead."""
    results = client.run_batch(server.base_url, batch, parallel=min(len(batch), CLIENT_PARALLEL))
    lost = [r.error for r in results if r.error and any(c in r.error for c in CONNECTION_LOST)]
    if lost or not server.alive():
        why = f"not sent: the server lost a connection in the batch before ({lost[0] if lost else 'it exited'})"
        return results + _not_sent(len(results), len(alone), why)
    return results + client.run_batch(server.base_url, alone, parallel=1)


def _raise_on_failed(server, results: list) -> None:
    """A crash (CheckFailure) when any of the tier's own requests failed, naming the server log's cause when the
    connection went with the server."""
    errors = [r.error for r in results if r.error]
    if errors:
        message = f"{len(errors)}/{len(results)} requests failed: {errors[0]}"
        if _went_with_server(server, results):
            # the connection went with the server: its log names why (a known upstream signature matches it)
            cause = server.exit_cause()
            message += f"; server log: {cause}" if cause else ""
        raise CheckFailure("crash", message)


def _keep_answers(run: SmokeRun, results: list, plan: list) -> None:
    """What the tier's own requests (_own_requests, in that order) got back, each kind in its own lists."""
    n_ids = len(results) - len(smoke.TEXT_PROMPTS) - len(plan)
    n_greedy = n_ids + len(smoke.TEXT_PROMPTS)
    run.sampled_requests = plan
    run.sampled_outputs = [list(r.response.get("output_ids") or []) for r in results[n_greedy:]]
    run.sampled_meta = [r.response.get("meta_info", {}) for r in results[n_greedy:]]
    for r in results[:n_ids]:
        run.id_outputs.append(list(r.response.get("output_ids") or []))
        meta = r.response.get("meta_info", {})
        run.id_meta.append(meta)
        if not run.spec.topk:
            run.id_top_logprobs.append([[(e[0], e[1]) for e in pos] for pos in meta.get("output_top_logprobs") or []])
    run.text_outputs = [r.response.get("text", "") for r in results[n_ids:n_greedy]]
    run.text_meta = [r.response.get("meta_info", {}) for r in results[n_ids:n_greedy]]
