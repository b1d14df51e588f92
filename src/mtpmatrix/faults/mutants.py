"""Fault injection: small source mutations of the installed sglang's MTP path, and whether the smoke tier notices.

    python -m mtpmatrix mutants                      baseline + every applicable mutant (needs a GPU)
    python -m mtpmatrix mutants --list | --check     the catalogue against the installed sglang (CPU, seconds)
    python -m mtpmatrix mutants --mutants ID,ID --out DIR --timeout S --budget S

The mutants: ``catalogue`` (data); how they are applied: ``mutation``; running the baseline and the mutant suites and judging them:
``suites``; this module is the command (and the nox session's helpers). Exit status: 0 only when the baseline
passes and every applicable mutant is killed; 1 otherwise; 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from mtpmatrix.core.atomic import atomic_write_json, atomic_write_text
from mtpmatrix.core.paths import MUTANTS, new_run_id, now, results_root
from mtpmatrix.core.schema import comma_list
from mtpmatrix.faults.catalogue import CATALOGUE, select
from mtpmatrix.faults.mutation import (
    Application,
    Mutant,
    MutantsError,
    apply,
    diff,
    find_sglang,
    hook_payload,
    sglang_version,
)
from mtpmatrix.faults.suites import (
    CORES_PER_SERVER,
    DEFAULT_TIMEOUT,
    Scheduler,
    Suite,
    Timing,
    hook_evidence,
    judge_suite,
    killed_by,
    mutant_status,
    overall,
    pytest_command,
    render_table,
    server_cap,
    suite_env,
)


# --------------------------------------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--list",
        action="store_true",
        help="only show the catalogue against the installed sglang (applicable / n.a.); no GPU",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="like --list, and check that every patched module compiles; exit 1 if one does not",
    )
    p.add_argument("--mutants", metavar="ID,ID", help="run only these mutants (default: all)")
    p.add_argument("--out", type=Path, help="output folder (default: results/mutants-<UTC timestamp>)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per suite (default %(default)s)")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole run: suites not started by then are "
        "recorded as not run, running ones are interrupted",
    )
    p.add_argument(
        "--servers",
        metavar="NAME,NAME",
        help="smoke servers for the baseline and every mutant (default: each mutant's own)",
    )
    p.add_argument(
        "--max-servers",
        type=int,
        help=f"servers launching at once (default: one per {CORES_PER_SERVER} cores, capped by free GPU memory)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="shared TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR parent (default: the libraries' per-user defaults)",
    )
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="start every suite at once instead of after the baseline's first server is ready",
    )
    p.add_argument(
        "--sglang-dir",
        type=Path,
        help="an sglang package folder to read instead of the importable one (--list/--check only)",
    )


def _servers(ns, mutant: Mutant) -> tuple[str, ...]:
    if ns.servers:
        return tuple(comma_list(ns.servers))
    return mutant.servers


def check_servers(names, known) -> None:
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        raise MutantsError(
            f"smoke server(s) {', '.join(unknown)} not in this checkout's smoke tier "
            f"(smoke_servers.SMOKE_SERVERS: {', '.join(known)}); pass --servers"
        )


def _listing(apps: list[Application], pkg_dir: Path, version: str | None, compile_check: bool) -> int:
    print(f"sglang {version or '(version unknown)'} at {pkg_dir}")
    width = max(len(a.mutant.id) for a in apps)
    bad = 0
    for a in apps:
        status = "applicable" if a.applicable else "n.a."
        if compile_check and a.error:
            status, bad = "BROKEN", bad + 1
        print(
            f"{a.mutant.id:<{width}}  {a.mutant.category:<15}  {status:<10}  "
            f"{a.error if compile_check and a.error else a.reason()}"
        )
    n_app = sum(a.applicable for a in apps)
    tail = f"{n_app} applicable, {len(apps) - n_app} n.a."
    if compile_check:
        tail += f"; {'every patched module compiles' if not bad else f'{bad} patched module(s) do not compile'}"
    print(tail)
    return 1 if bad else 0


@dataclass(frozen=True)
class StandIns:
    """What a test puts in place of the real thing: another catalogue, an sglang folder, a stand-in for the pytest
    command, the smoke server names, no GPU probe, a CPU count and free GPU memory, a faster poll, a log to read."""

    catalogue: tuple[Mutant, ...] = CATALOGUE
    pkg_dir: Path | None = None
    command: Callable[[Suite], list[str]] = pytest_command
    known_servers: list[str] | None = None
    gpu_check: bool = True
    cpus: int | None = None
    free_mib: int | None = None
    poll: float = 1.0
    log: Callable[[str], None] = print


def run(ns: argparse.Namespace, stand_ins: StandIns | None = None) -> int:
    """The ``mutants`` subcommand (``stand_ins``: for tests only)."""
    try:
        return _run(ns, stand_ins or StandIns())
    except MutantsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(ns, stand_ins: StandIns) -> int:
    """The steps of a run: options, the catalogue against this sglang, (--list/--check stop here), the servers and the
    box, the suites' folders, the record, the scheduler, the table."""
    _check_options(ns)
    pkg_dir, version, apps = _applications(ns, stand_ins.catalogue, stand_ins.pkg_dir)
    if ns.list or ns.check:
        return _listing(apps, pkg_dir, version, compile_check=ns.check)
    applicable = _runnable(apps, pkg_dir, version, stand_ins.log)
    if not applicable:
        return 1
    union = _suite_servers(ns, applicable, stand_ins.known_servers)
    cap = _server_cap(ns, stand_ins.gpu_check, stand_ins.cpus, stand_ins.free_mib)
    out = Path(ns.out or results_root() / new_run_id(kind=MUTANTS)).resolve()
    suites = _suites(ns, out, applicable, union)
    run = MutantsRun(out, _new_record(ns, apps, version, pkg_dir, out, union, cap, stand_ins.cpus), stand_ins.log)
    stand_ins.log(
        f"[mutants] sglang {version} at {pkg_dir}; {len(applicable)} applicable of {len(apps)}; baseline on "
        f"{', '.join(union)}; up to {cap} servers at once; results in {out}"
    )
    run.save()
    timing = Timing(ns.timeout, budget=ns.budget, poll=stand_ins.poll)
    sched = Scheduler(
        suites, cap, timing, warmup=ns.warmup, command=stand_ins.command, log=stand_ins.log, on_done=run.done
    )
    run.scheduler = sched
    interrupted = _schedule(sched)
    run.finish(sched.not_run, interrupted)
    _print_table(run.record, version, out, stand_ins.log)
    return run.record["exit"]


def _check_options(ns) -> None:
    if ns.timeout <= 0 or (ns.budget is not None and ns.budget <= 0):
        raise MutantsError("--timeout and --budget must be positive")
    if ns.max_servers is not None and ns.max_servers < 1:
        raise MutantsError("--max-servers must be >= 1")
    if ns.sglang_dir is not None and not (ns.list or ns.check):
        raise MutantsError("--sglang-dir is for --list/--check; a run uses the importable sglang")


def _applications(ns, catalogue, pkg_dir) -> tuple[Path, str | None, list[Application]]:
    """The chosen mutants applied, in memory, to the sglang at --sglang-dir or the importable one."""
    chosen = select(ns.mutants, catalogue)
    pkg_dir = ns.sglang_dir or pkg_dir or find_sglang()
    if pkg_dir is None or not Path(pkg_dir).is_dir():
        raise MutantsError(
            f"no sglang here ({ns.sglang_dir or sys.executable}): run inside a row venv "
            "(nox -s mutants -- --row ROW) or with PYTHONPATH naming an sglang bundle"
        )
    pkg_dir = Path(pkg_dir)
    version = sglang_version(pkg_dir)
    return pkg_dir, version, [apply(m, pkg_dir) for m in chosen]


def _runnable(apps: list[Application], pkg_dir: Path, version: str | None, log) -> list[Application]:
    """The applicable mutants; a patched module that does not compile is a catalogue bug (bad input)."""
    broken = [a for a in apps if a.applicable and a.error]
    if broken:
        raise MutantsError(f"mutant {broken[0].mutant.id}: {broken[0].error}")
    applicable = [a for a in apps if a.applicable]
    if not applicable:
        _listing(apps, pkg_dir, version, compile_check=False)
        log("NOTHING-APPLICABLE: no selected mutant applies to this sglang release; nothing to run")
    return applicable


def _suite_servers(ns, applicable: list[Application], known_servers) -> list[str]:
    """The baseline's servers: every server a mutant's suite launches, each once, all known to this checkout."""
    if known_servers is None:
        from mtpmatrix.core.smoke_servers import SMOKE_SERVERS

        known_servers = [s.name for s in SMOKE_SERVERS]
    union: list[str] = []
    for a in applicable:
        union += [s for s in _servers(ns, a.mutant) if s not in union]
    check_servers(union, known_servers)
    return union


def _server_cap(ns, gpu_check: bool, cpus: int | None, free_mib: int | None) -> int:
    if gpu_check:
        from mtpmatrix.serving.environment import gpu_free_mib, gpu_missing

        why = gpu_missing(1)
        if why:
            raise MutantsError(f"the mutant suites need a GPU: {why} (--list/--check need none)")
        if free_mib is None:
            free_mib = gpu_free_mib()
    return server_cap(cpus if cpus is not None else os.cpu_count(), free_mib, ns.max_servers)


def _suites(ns, out: Path, applicable: list[Application], union: list[str]) -> list[Suite]:
    """The baseline first, then one suite per applicable mutant, each with its folder, hook payload and diff."""
    out.mkdir(parents=True, exist_ok=True)
    tiny = Path(os.environ.get("MTPMATRIX_TINY_DIR") or out / "tiny").resolve()
    cache = ns.cache_dir.resolve() if ns.cache_dir else None
    base_env = dict(os.environ)
    baseline = Suite("baseline", tuple(union), out / "baseline", {})
    baseline.env = suite_env(base_env, baseline.servers, baseline.folder, tiny, None, cache)
    suites = [baseline]
    for a in applicable:
        folder = out / a.mutant.id
        folder.mkdir(parents=True, exist_ok=True)
        payload = folder / "mutant.json"
        atomic_write_json(payload, hook_payload(a))
        atomic_write_text(folder / "patch.diff", diff(a))
        s = Suite(a.mutant.id, _servers(ns, a.mutant), folder, {})
        s.env = suite_env(base_env, s.servers, folder, tiny, payload, cache)
        suites.append(s)
    return suites


def _new_record(ns, apps, version, pkg_dir, out, union, cap, cpus) -> MutantsRecord:
    return {
        "kind": "mutants",
        "schema": 1,
        "sglang": {"version": version, "path": str(pkg_dir)},
        "started": now(),
        "finished": None,
        "seconds": None,
        "host": {"cpus": cpus or os.cpu_count()},
        "max_servers": cap,
        "timeout": ns.timeout,
        "budget": ns.budget,
        "out": str(out),
        "baseline": {"status": "pending", "servers": list(union), "dir": str(out / "baseline")},
        "mutants": [_mutant_entry(a, _servers(ns, a.mutant), out, version) for a in apps],
        "verdict": "pending",
    }


class MutantsRecord(TypedDict, total=False):
    """mutants.json: the run, its baseline and one entry per selected mutant (``_mutant_entry``)."""

    kind: str
    schema: int
    sglang: dict
    started: str
    finished: str | None
    seconds: float | None
    host: dict
    max_servers: int
    timeout: float
    budget: float | None
    out: str
    baseline: dict
    mutants: list[dict]
    verdict: str
    exit: int


class MutantsRun:
    """One run's record, kept on disk after every finished suite (mutants.json, written atomically)."""

    def __init__(self, out: Path, record: MutantsRecord, log):
        self.out, self.record, self.log = out, record, log
        self.entries = {m["id"]: m for m in record["mutants"]}
        self.t0 = time.monotonic()
        self.scheduler: Scheduler | None = None  # set once built: a failed baseline stops it starting more

    def save(self) -> None:
        self.record["seconds"] = round(time.monotonic() - self.t0, 1)
        atomic_write_json(self.out / "mutants.json", self.record)

    def done(self, suite: Suite) -> None:
        """A finished suite judged: the baseline (passed, or the run is invalid) or a mutant (killed or not)."""
        outcome = judge_suite(_read_tiers(suite.folder / "tiers.json"), suite.exitstatus, suite.timed_out)
        if suite.name == "baseline":
            self.record["baseline"].update(
                status=outcome.status,
                seconds=suite.seconds,
                checks=outcome.failed,
                passed=outcome.passed,
                reason=outcome.reason,
            )
            line = (
                outcome.status
                + (f" ({outcome.reason})" if outcome.reason else "")
                + (f" - {killed_by(outcome.failed)}" if outcome.failed else "")
            )
            if outcome.status != "passed":
                self.scheduler.stop_new = True
                line += "; result invalid, no further suites started"
        else:
            entry = self.entries[suite.name]
            served, refused = hook_evidence(suite.folder, suite.name)
            status, reason = mutant_status(outcome, served, refused)
            entry.update(
                status=status,
                reason=reason,
                seconds=suite.seconds,
                checks=outcome.failed,
                killed_by=killed_by(outcome.failed) if status == "killed" else "",
                passed=outcome.passed,
            )
            line = status + (f" by {entry['killed_by']}" if status == "killed" else f" ({reason})" if reason else "")
        self.log(f"[mutants] done  {suite.name}: {line} ({suite.seconds:.0f} s)")
        self.save()

    def finish(self, not_run: list[Suite], interrupted: bool) -> None:
        for s in not_run:
            if s.name == "baseline":
                self.record["baseline"].update(status="not-run")
            else:
                self.entries[s.name].update(
                    status="not-run", reason="not started (baseline failed, budget spent or interrupted)"
                )
        verdict, rc = overall(self.record["baseline"], self.record["mutants"])
        self.record.update(verdict="interrupted" if interrupted else verdict, finished=now())
        self.record["exit"] = 130 if interrupted else rc
        self.save()


def _schedule(sched: Scheduler) -> bool:
    """Run every suite; True when interrupted (Ctrl-C, or a wrapper's SIGTERM, which stops the suites alike)."""

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread
        previous = None
    try:
        sched.run()
    except KeyboardInterrupt:
        return True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return False


def _print_table(record: MutantsRecord, version: str | None, out: Path, log) -> None:
    rows = [
        {
            "id": "baseline",
            "models": f"unpatched sglang {version}",
            "status": record["baseline"]["status"],
            "killed_by": "",
            "seconds": record["baseline"].get("seconds"),
        }
    ] + record["mutants"]
    log("")
    log(render_table(rows))
    log("")
    log(_verdict_line(record["verdict"], record))
    log(_wall_line(record))
    log(f"results: {out / 'mutants.json'}")


def _verdict_line(verdict: str, record: dict) -> str:
    ms = record["mutants"]
    counts = {s: sum(m["status"] == s for m in ms) for s in ("killed", "survived", "error", "not-run", "n.a.")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if verdict == "invalid":
        b = record["baseline"]
        return (
            f"RESULT INVALID: the unpatched baseline did not pass ({b['status']}"
            f"{': ' + b['reason'] if b.get('reason') else ''}"
            f"{'; ' + killed_by(b.get('checks') or []) if b.get('checks') else ''}); {summary}"
        )
    return f"{verdict.upper()}: {summary}"


def _wall_line(record: dict) -> str:
    """The run's wall time against its budget and the suites' own seconds (issue #41: the catalogue in 10 minutes)."""
    spent = sum(m["seconds"] or 0 for m in record["mutants"]) + (record["baseline"].get("seconds") or 0)
    budget = record["budget"]
    return (
        f"wall {record['seconds']:.0f} s"
        + (f" of the {budget:.0f} s budget ({record['seconds'] / budget:.2f})" if budget else " (no budget)")
        + f"; suites' own seconds {spent:.0f}, up to {record['max_servers']} servers at once"
    )


def _mutant_entry(a: Application, servers: tuple[str, ...], out: Path, version: str | None) -> dict:
    m = a.mutant
    return {
        "id": m.id,
        "category": m.category,
        "models": m.models,
        "expect": m.expect,
        "sglang": version,
        "status": "pending" if a.applicable else "n.a.",
        "reason": "" if a.applicable else a.reason(),
        "files": a.files,
        "sites": [
            {"module": s.site.module, "file": s.file, "anchor": s.site.anchor, "status": s.status} for s in a.sites
        ],
        "servers": list(servers),
        "checks": [],
        "killed_by": "",
        "seconds": None,
        "dir": str(out / m.id) if a.applicable else None,
    }


def _read_tiers(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
