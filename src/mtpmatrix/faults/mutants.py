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
from pathlib import Path

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


def run(
    ns: argparse.Namespace,
    *,
    catalogue: tuple[Mutant, ...] = CATALOGUE,
    pkg_dir: Path | None = None,
    command=pytest_command,
    known_servers=None,
    gpu_check: bool = True,
    cpus: int | None = None,
    free_mib: int | None = None,
    poll: float = 1.0,
    log=print,
) -> int:
    """The ``mutants`` subcommand. The keywords exist for tests: another catalogue, an sglang folder, a stand-in
    for the pytest command, the smoke server names, no GPU probe, a CPU count."""
    try:
        return _run(
            ns,
            catalogue=catalogue,
            pkg_dir=pkg_dir,
            command=command,
            known_servers=known_servers,
            gpu_check=gpu_check,
            cpus=cpus,
            free_mib=free_mib,
            poll=poll,
            log=log,
        )
    except MutantsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(ns, *, catalogue, pkg_dir, command, known_servers, gpu_check, cpus, free_mib, poll, log) -> int:
    chosen = select(ns.mutants, catalogue)
    if ns.timeout <= 0 or (ns.budget is not None and ns.budget <= 0):
        raise MutantsError("--timeout and --budget must be positive")
    if ns.max_servers is not None and ns.max_servers < 1:
        raise MutantsError("--max-servers must be >= 1")
    listing = ns.list or ns.check
    if ns.sglang_dir is not None and not listing:
        raise MutantsError("--sglang-dir is for --list/--check; a run uses the importable sglang")
    pkg_dir = ns.sglang_dir or pkg_dir or find_sglang()
    if pkg_dir is None or not Path(pkg_dir).is_dir():
        raise MutantsError(
            f"no sglang here ({ns.sglang_dir or sys.executable}): run inside a row venv "
            "(nox -s mutants -- --row ROW) or with PYTHONPATH naming an sglang bundle"
        )
    pkg_dir = Path(pkg_dir)
    version = sglang_version(pkg_dir)
    apps = [apply(m, pkg_dir) for m in chosen]
    if listing:
        return _listing(apps, pkg_dir, version, compile_check=ns.check)

    broken = [a for a in apps if a.applicable and a.error]
    if broken:
        raise MutantsError(f"mutant {broken[0].mutant.id}: {broken[0].error}")
    if not any(a.applicable for a in apps):
        _listing(apps, pkg_dir, version, compile_check=False)
        log("NOTHING-APPLICABLE: no selected mutant applies to this sglang release; nothing to run")
        return 1
    if known_servers is None:
        from mtpmatrix.core.smoke_servers import SMOKE_SERVERS

        known_servers = [s.name for s in SMOKE_SERVERS]
    applicable = [a for a in apps if a.applicable]
    union: list[str] = []
    for a in applicable:
        union += [s for s in _servers(ns, a.mutant) if s not in union]
    check_servers(union, known_servers)
    if gpu_check:
        from mtpmatrix.serving.environment import gpu_missing

        why = gpu_missing(1)
        if why:
            raise MutantsError(f"the mutant suites need a GPU: {why} (--list/--check need none)")
    if free_mib is None and gpu_check:
        from mtpmatrix.serving.environment import gpu_free_mib

        free_mib = gpu_free_mib()
    cap = server_cap(cpus if cpus is not None else os.cpu_count(), free_mib, ns.max_servers)

    out = Path(ns.out or results_root() / new_run_id(kind=MUTANTS)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tiny = Path(os.environ.get("MTPMATRIX_TINY_DIR") or out / "tiny").resolve()
    cache = ns.cache_dir.resolve() if ns.cache_dir else None
    base_env = dict(os.environ)

    suites = [Suite("baseline", tuple(union), out / "baseline", {})]
    suites[0].env = suite_env(base_env, suites[0].servers, suites[0].folder, tiny, None, cache)
    by_suite: dict[str, Application] = {}
    for a in applicable:
        folder = out / a.mutant.id
        folder.mkdir(parents=True, exist_ok=True)
        payload = folder / "mutant.json"
        atomic_write_json(payload, hook_payload(a))
        atomic_write_text(folder / "patch.diff", diff(a))
        s = Suite(a.mutant.id, _servers(ns, a.mutant), folder, {})
        s.env = suite_env(base_env, s.servers, folder, tiny, payload, cache)
        suites.append(s)
        by_suite[s.name] = a

    record = {
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
        "baseline": {"status": "pending", "servers": list(suites[0].servers), "dir": str(suites[0].folder)},
        "mutants": [_mutant_entry(a, _servers(ns, a.mutant), out, version) for a in apps],
        "verdict": "pending",
    }
    entries = {m["id"]: m for m in record["mutants"]}
    t0 = time.monotonic()
    log(
        f"[mutants] sglang {version} at {pkg_dir}; {len(applicable)} applicable of {len(apps)}; baseline on "
        f"{', '.join(union)}; up to {cap} servers at once; results in {out}"
    )

    def save() -> None:
        record["seconds"] = round(time.monotonic() - t0, 1)
        atomic_write_json(out / "mutants.json", record)

    sched: Scheduler | None = None

    def done(suite: Suite) -> None:
        tiers = _read_tiers(suite.folder / "tiers.json")
        outcome = judge_suite(tiers, suite.exitstatus, suite.timed_out)
        if suite.name == "baseline":
            entry = record["baseline"]
            entry.update(
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
                sched.stop_new = True
                line += "; result invalid, no further suites started"
        else:
            entry = entries[suite.name]
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
        log(f"[mutants] done  {suite.name}: {line} ({suite.seconds:.0f} s)")
        save()

    save()
    sched = Scheduler(
        suites, cap, ns.timeout, budget=ns.budget, warmup=ns.warmup, command=command, log=log, on_done=done, poll=poll
    )
    interrupted = False

    def _terminate(signum, frame):  # a wrapper's SIGTERM stops the suites like Ctrl-C does
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread
        previous = None
    try:
        sched.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for s in sched.not_run:
        if s.name == "baseline":
            record["baseline"].update(status="not-run")
        else:
            entries[s.name].update(
                status="not-run", reason="not started (baseline failed, budget spent or interrupted)"
            )
    verdict, rc = overall(record["baseline"], record["mutants"])
    record.update(verdict="interrupted" if interrupted else verdict, finished=now())
    record["exit"] = 130 if interrupted else rc
    save()
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
    log(_verdict_line(verdict, record))
    log(_wall_line(record))
    log(f"results: {out / 'mutants.json'}")
    return record["exit"]


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
