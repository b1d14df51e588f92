"""Running mutant suites: the unpatched smoke suite (the baseline) and one smoke suite per applicable mutant, each
in its own folder, several side by side (``Scheduler``), and what each suite's tiers.json and server logs say.

A mutant is *killed* when any check of its suite fails, *survived* when all pass; a mutant whose servers never
loaded it is an error, not a result. A failing baseline makes the whole result invalid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core.paths import REPO, SUITE  # SUITE: the smoke checks are in every test module of it
from mtpmatrix.core.schema import FAILING, short_check_id
from mtpmatrix.faults.mutation import ENV_MUTANT, HOOK_DIR, MARK
from mtpmatrix.serving.processes import LOG_NOTE, READY_NOTE, group_members

# Concurrency is bounded by CPU, not GPU memory: a server launch is mostly CPU-bound Triton compilation, processor
# loading and CUDA-graph capture. Measured on one H200 box with 16 cores (sglang 0.5.17, tiny pairs, warm caches):
# 5 servers side by side launched in 52-77 s and a suite of 5 took 100-150 s; two suites of four (8 servers) took
# 200-240 s; 3-4 suites side by side (12-16 servers) went CPU-bound (launches up to 381 s) and timed out. So one
# concurrently launching server per CORES_PER_SERVER cores (5 on 16 cores), and never more than the GPU-memory
# rule of the smoke tier allows (launch_plan.memory_parallelism).
CORES_PER_SERVER = 3
DEFAULT_TIMEOUT = 480  # seconds per suite; a smoke server gets 420 s to become ready
MIN_SUITE_SECONDS = 90  # with --budget: a suite is not started with less left (a warm one takes ~90 s)
SERVER_PGID = re.compile(r"^# pid (\d+) \(process group (\d+)\)", re.M)  # SglangServer's log header
READY_LINE = LOG_NOTE + READY_NOTE  # SglangServer's log line once a server answers


# --------------------------------------------------------------------------------------------- verdicts
@dataclass
class SuiteOutcome:
    status: str  # passed | failed | error | timeout
    failed: list[dict] = field(default_factory=list)  # {id, outcome, kind, message}
    passed: int = 0
    reason: str = ""


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def judge_suite(tiers: dict | None, exitstatus: int | None = None, timed_out: bool = False) -> SuiteOutcome:
    """A smoke suite's outcome from its tiers.json (None: pytest left none)."""
    if timed_out:
        return SuiteOutcome("timeout", reason="suite timed out (no verdict: not counted as killed)")
    if tiers is None:
        return SuiteOutcome("error", reason=f"pytest exited {exitstatus} without tiers.json (see pytest.log)")
    smoke = (tiers.get("tiers") or {}).get("smoke") or {}
    checks = smoke.get("checks") or []
    failed = []
    for c in checks:
        if c.get("outcome") not in FAILING:
            continue
        if c.get("known_upstream"):
            # intact sglang fails it the same way (known_upstream.json, by its exact signature): no kill, and no
            # failure of the baseline (H200, 0.5.17: min_p in verify, stop order, min_new_tokens per verify step)
            continue
        f = c.get("failure") or {}
        failed.append(
            {
                "id": c.get("id", "?"),
                "outcome": c["outcome"],
                "kind": f.get("kind", "?"),
                "message": _first_line(f.get("message", "")),
            }
        )
    passed = sum(c.get("outcome") == "passed" for c in checks)
    if failed:
        if all(f["kind"] == "harness" for f in failed):  # this project's own bug: never a verdict on sglang
            return SuiteOutcome("error", failed, passed, "only harness failures: " + failed[0]["message"])
        return SuiteOutcome("failed", failed, passed)
    if not passed:
        return SuiteOutcome(
            "error", [], 0, "no smoke check ran: " + _first_line(smoke.get("reason") or "smoke tier missing")
        )
    if smoke.get("verdict") in FAILING:  # e.g. pytest stopped early after some checks passed
        return SuiteOutcome("error", [], passed, _first_line(smoke.get("reason") or "smoke tier did not finish"))
    return SuiteOutcome("passed", [], passed)


def hook_evidence(folder: Path, mutant_id: str) -> tuple[bool, str | None]:
    """(a server process loaded the patched module, the first 'NOT applied' line if any) from the server logs."""
    served, refused = False, None
    for log in sorted(Path(folder).rglob("server-*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith(MARK):
                continue
            if f"{MARK} {mutant_id} serves patched " in line:
                served = True
            elif "NOT applied" in line and refused is None:
                refused = line.strip()
    return served, refused


def mutant_status(outcome: SuiteOutcome, served: bool, refused: str | None) -> tuple[str, str]:
    """(killed | survived | error, reason) of an applicable mutant's suite."""
    if refused:
        return "error", refused
    if outcome.status in ("timeout", "error"):
        return "error", outcome.reason
    if not served:
        return "error", "no server process loaded the patched module (no hook line in the server logs)"
    if outcome.status == "failed":
        return "killed", ""
    return "survived", f"all {outcome.passed} checks passed"


def killed_by(checks: list[dict], limit: int = 2) -> str:
    names = [f"{short_check_id(c['id'])} ({c['kind']})" for c in checks]
    if len(names) > limit:
        names = names[:limit] + [f"+{len(names) - limit} more"]
    return ", ".join(names)


def overall(baseline: dict | None, mutants: list[dict]) -> tuple[str, int]:
    """(verdict, exit status): 0 only when the baseline passed and every applicable mutant was killed."""
    if baseline is None or baseline.get("status") != "passed":
        return "invalid", 1
    applicable = [m for m in mutants if m["status"] != "n.a."]
    if not applicable:
        return "nothing-applicable", 1
    if all(m["status"] == "killed" for m in applicable):
        return "all-killed", 0
    if any(m["status"] == "survived" for m in applicable):
        return "survivors", 1
    return "incomplete", 1


# --------------------------------------------------------------------------------------------- the table
def render_table(rows: list[dict], models_width: int = 58) -> str:
    """rows: {id, models, status, killed_by, seconds} -> fixed-width text."""
    head = ("mutant", "what it models", "status", "killed by", "s")
    body = []
    for r in rows:
        models = r.get("models", "")
        if len(models) > models_width:
            models = models[: models_width - 3] + "..."
        secs = r.get("seconds")
        body.append((r["id"], models, r["status"], r.get("killed_by") or "-", "-" if secs is None else f"{secs:.0f}"))
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) if body else len(head[i]) for i in range(5)]

    def fmt(cols) -> str:
        return "  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *(fmt(b) for b in body)])


# --------------------------------------------------------------------------------------------- scheduling
def server_cap(cpus: int | None, free_mib: int | None, requested: int | None = None) -> int:
    """Smoke servers allowed to launch at once: ``requested`` when given, else one per CORES_PER_SERVER cores,
    capped by the smoke tier's GPU-memory rule when free memory is known."""
    if requested is not None:
        return max(1, requested)
    cap = max(1, (cpus or 1) // CORES_PER_SERVER)
    if free_mib is not None:
        from mtpmatrix.serving.launch_plan import memory_parallelism

        cap = min(cap, memory_parallelism(free_mib))
    return max(1, cap)


@dataclass
class Suite:
    name: str  # "baseline" or the mutant id
    servers: tuple[str, ...]
    folder: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started: float | None = None
    deadline: float | None = None
    interrupted_at: float | None = None
    timed_out: bool = False
    seconds: float | None = None
    exitstatus: int | None = None
    log_fh: object = None

    @property
    def n(self) -> int:
        return len(self.servers)


def pytest_command(suite: Suite, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "pytest",
        SUITE,
        "-p",
        "no:cacheprovider",
        "--tiers",
        "smoke",
        "--mtp-results",
        str(suite.folder / "tiers.json"),
    ]


def suite_env(
    base: dict, servers: tuple[str, ...], folder: Path, tiny_dir: Path, payload: Path | None, cache_dir: Path | None
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != ENV_MUTANT}
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])])
    env.update(
        {
            "MTPMATRIX_SMOKE_SERVERS": ",".join(servers),
            "MTPMATRIX_SMOKE_PARALLEL": str(len(servers)),
            "MTPMATRIX_TINY_DIR": str(tiny_dir),
            "MTPMATRIX_RESULTS": str(folder / "tiers.json"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("MTPMATRIX_SMOKE_SWAP_DRAFTERS", None)
    if cache_dir is not None:  # else each library's per-user default, which every suite shares anyway
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    if payload is not None:
        env[ENV_MUTANT] = str(payload)
    return env


def stop_leftover_servers(folder: Path) -> list[int]:
    """Kill the process groups of servers this suite started that are still alive: the groups named in their
    log headers, while a live member is still an sglang (or multiprocessing spawn) process. SglangServer.stop()
    normally leaves nothing; this is for a suite that had to be killed."""
    killed = []
    for log in Path(folder).rglob("server-*.log"):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for m in SERVER_PGID.finditer(text):
            pgid = int(m.group(2))
            cmdlines = []
            for pid in group_members(pgid):
                try:
                    cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    pass
            if any("sglang" in c or "spawn_main" in c for c in cmdlines):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
                except (ProcessLookupError, PermissionError):
                    pass
    return killed


def _sigint_at_default() -> None:
    """In a suite's process, before exec: SIGINT at its default, so that pytest raises KeyboardInterrupt on the
    scheduler's SIGINT (stops its servers, writes tiers.json) even when this runner was started with SIGINT ignored,
    as a background job of a non-interactive shell is. An ignored SIGINT stays ignored across exec, Python then
    installs no handler, and every timed-out suite would be SIGKILLed after its grace with nothing recorded."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass(frozen=True)
class Timing:
    """The scheduler's clock, in seconds: each suite's limit, the whole run's (None: no limit) and the least of it a
    suite still starts with, how often it polls, how long an interrupted suite gets before SIGKILL, how often it logs
    what is running."""

    timeout: float
    budget: float | None = None
    min_suite: float = MIN_SUITE_SECONDS
    poll: float = 1.0
    grace: float = 45.0
    heartbeat: float = 60.0


class Scheduler:
    """Runs suites side by side under a cap on concurrently launched servers, the first one (the baseline) alone
    until one of its servers is ready (tiny pairs built once, Triton/inductor caches warm for the rest)."""

    def __init__(
        self,
        suites: list[Suite],
        cap: int,
        timing: Timing,
        *,
        warmup: bool = True,
        command=pytest_command,
        log=print,
        on_done=None,
    ):
        self.queue = list(suites)
        self.suites = list(suites)
        self.cap, self.timing, self.warmup = cap, timing, warmup
        self.command, self.log, self.on_done = command, log, on_done
        self.running: list[Suite] = []
        self.t0 = time.monotonic()
        self.stop_new = False  # set when the baseline failed, or on Ctrl-C
        self.not_run: list[Suite] = []

    def _busy(self) -> int:
        return sum(s.n for s in self.running)

    def _first_ready(self) -> bool:
        first = self.suites[0]
        if first.proc is None:
            return False
        if first.seconds is not None:
            return True
        for log in first.folder.rglob("server-*.log"):
            try:
                if READY_LINE in log.read_text(errors="replace"):
                    return True
            except OSError:
                pass
        return False

    def _may_start(self, suite: Suite) -> bool:
        if self.stop_new:
            return False
        if self.warmup and suite is not self.suites[0] and not self._first_ready():
            return False
        return not self.running or self._busy() + suite.n <= self.cap

    def _start(self, suite: Suite) -> None:
        suite.folder.mkdir(parents=True, exist_ok=True)
        suite.log_fh = open(suite.folder / "pytest.log", "ab", buffering=0)
        suite.started = time.monotonic()
        limit = self.timing.timeout
        if self.timing.budget is not None:
            limit = min(limit, self.timing.budget - (suite.started - self.t0))
        suite.deadline = suite.started + max(1.0, limit)
        suite.proc = subprocess.Popen(
            self.command(suite),
            cwd=REPO,
            env=suite.env,
            stdin=subprocess.DEVNULL,
            stdout=suite.log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_sigint_at_default,
        )
        self.running.append(suite)
        self.log(
            f"[mutants] start {suite.name} ({', '.join(suite.servers)}; {self._busy()}/{self.cap} server "
            f"slots busy; {self._elapsed():.0f} s elapsed)"
        )

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _interrupt(self, suite: Suite) -> None:
        if suite.interrupted_at is None and suite.proc is not None and suite.proc.poll() is None:
            suite.interrupted_at = time.monotonic()
            try:
                os.kill(suite.proc.pid, signal.SIGINT)  # pytest stops its servers and still writes tiers.json
            except ProcessLookupError:
                pass

    def _reap(self, suite: Suite) -> bool:
        """True once ``suite`` has finished (normally, or killed after its deadline and grace)."""
        now = time.monotonic()
        if suite.proc.poll() is None:
            if now >= suite.deadline and suite.interrupted_at is None:
                suite.timed_out = True
                self.log(f"[mutants] timeout {suite.name} after {now - suite.started:.0f} s: interrupting")
                self._interrupt(suite)
            if suite.interrupted_at is not None and now - suite.interrupted_at >= self.timing.grace:
                try:
                    os.killpg(suite.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                suite.proc.wait()
            else:
                return False
        suite.exitstatus = suite.proc.returncode
        suite.seconds = round(now - suite.started, 1)
        suite.log_fh.close()
        stop_leftover_servers(suite.folder)
        return True

    def run(self) -> None:
        last_beat = time.monotonic()
        try:
            while self.queue or self.running:
                self._drop_what_the_budget_cannot_start()
                while self.queue and self._may_start(self.queue[0]):
                    self._start(self.queue.pop(0))
                if self.stop_new:
                    self._not_run_queued()
                self._reap_finished()
                if time.monotonic() - last_beat >= self.timing.heartbeat and self.running:
                    last_beat = time.monotonic()
                    self.log(
                        f"[mutants] {self._elapsed():.0f} s: running {', '.join(s.name for s in self.running)}"
                        f"; {len(self.queue)} queued"
                    )
                if self.queue or self.running:
                    time.sleep(self.timing.poll)
        except KeyboardInterrupt:
            self.log("[mutants] interrupted: stopping the running suites")
            self.stop_new = True
            self._not_run_queued()
            for suite in self.running:
                self._interrupt(suite)
            while self.running:
                self._reap_finished()
                time.sleep(self.timing.poll)
            raise

    def _drop_what_the_budget_cannot_start(self) -> None:
        budget, min_suite = self.timing.budget, self.timing.min_suite
        if budget is not None and self.queue and budget - self._elapsed() < min_suite:
            self.log(
                f"[mutants] less than {min_suite:.0f} s of the {budget:.0f} s budget left: "
                f"{len(self.queue)} suite(s) not run"
            )
            self._not_run_queued()

    def _not_run_queued(self) -> None:
        self.not_run += self.queue
        self.queue.clear()

    def _reap_finished(self) -> None:
        for suite in list(self.running):
            if self._reap(suite):
                self.running.remove(suite)
                if self.on_done is not None:
                    self.on_done(suite)
