"""One canary's run (real installs), in the steps runner/culprit.py's docstring names, each recorded in
``results/<run>/<canary>/canary.json`` (atomic; ``--resume`` continues from it): the canary's row, the
install-ability search when it cannot install, its tiers read against the pinned row's baseline, the culprit search
of the cheapest tier it breaks, the retries with each blocking pin's companion moved, and the record."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix.core import expected, paths
from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.evidence import fingerprint, manifest
from mtpmatrix.core.rows import RowError
from mtpmatrix.core.schema import FAILING, ROW_FILE
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import baseline, bisect, installable, matrix, plan
from mtpmatrix.runner.canary import Resolution, canary_row, describe_resolution
from mtpmatrix.runner.culprit_search import (
    Budget,
    abi_statement,
    find_culprit,
    first_failure,
    record_seconds,
    run_summary,
    summary_lines,
)
from mtpmatrix.runner.probe import not_proven_why

CANARY_FILE = "canary.json"


@dataclass
class CanaryRun:
    """What the steps of one canary's run share. ``res``, ``record``, ``copts`` and ``searched`` are the run whose
    tiers are read: the canary's own, or the newest releases that install when it cannot (step 1b)."""

    res: Resolution
    opts: matrix.Options
    repo: Path
    log: Callable[[str], None]
    store: RunStore
    state: dict  # canary.json
    before: dict  # what a resumed run measured before: its blocking retries, seconds, install search
    copts: matrix.Options  # opts with the canary's overrides
    record: dict = field(default_factory=dict)
    searched: dict = field(default_factory=dict)
    budget: Budget = field(default_factory=lambda: Budget(None))
    broken: list[str] = field(default_factory=list)
    pins_pass: bool = False

    @property
    def out_dir(self) -> Path:
        return self.store.row_dir(self.res.canary.id)

    @property
    def probes_run(self) -> str:
        return paths.canary_probes_run(self.opts.run_id, self.res.canary.id)

    def save(self) -> None:
        atomic_write_json(self.out_dir / CANARY_FILE, self.state)


def run_canary(
    res: Resolution,
    opts: matrix.Options,
    *,
    repo: Path = paths.REPO,
    budget_s: float | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run one resolved canary and, when it breaks a tier its pinned row passes, its culprit search."""
    run = start(res, opts, repo, log)
    t0 = time.monotonic()
    run_row(run)
    run.budget = Budget(budget_s)
    search_installable(run)
    read_tiers(run)
    search_culprit(run)
    retry_blocking_pins(run)
    # wall time over every session of this canary: a resumed one adds what it spent to what was spent before
    run.state["seconds"] = round((run.before["seconds"] or 0.0) + time.monotonic() - t0, 1)
    run.state["summary"] = summary_lines(run.state, run.res, run.record)
    run.save()
    return run.state


def start(res: Resolution, opts: matrix.Options, repo: Path, log: Callable[[str], None]) -> CanaryRun:
    """The canary's state: canary.json read back under ``--resume``, its resolution logged."""
    store = RunStore(opts.results, opts.run_id)
    state_file = store.row_dir(res.canary.id) / CANARY_FILE
    state = read_json(state_file) if opts.resume and state_file.exists() else {}
    before = {k: state.get(k) for k in ("blocking", "seconds", "install")}  # a resumed run keeps what it measured
    state.update(
        canary=res.as_dict(),
        run_id=opts.run_id,
        resolution=describe_resolution(res),
        resumed=bool(opts.resume and before["seconds"] is not None),
    )
    log(state["resolution"])
    copts = matrix.Options(
        **{
            **opts.__dict__,
            "overrides": [*opts.overrides, *(res.overrides if res.canary.override else [])],
            "record_extra": {"canary": res.as_dict()},
        }
    )
    return CanaryRun(res, opts, repo, log, store, state, before, copts)


def run_row(run: CanaryRun) -> None:
    """Step 1: the canary as a row of the run, at its releases (``--resume``: its finished record is read back)."""
    res, opts, c = run.res, run.opts, run.res.canary
    row = canary_row(res, run.out_dir / "resolved")
    # the run plans the canary as resolved: its pins and its overrides (the report judges its record against them)
    manifest.ensure(
        run.store.path,
        opts.run_id,
        {c.id: manifest.planned_row(row.as_dict(), row.path.read_text(), run.copts.overrides)},
        plan.invocation(run.copts),
        fingerprint.describe(),
    )
    if opts.resume and run.store.finished(c.id):
        run.record = run.store.load_row(c.id)
        run.log(f"[{c.id}] reusing its finished row record (--resume)")
    else:
        venv = bisect.make_venv(row, run.repo / ".nox" / f"canary-{c.id}")
        run.record = matrix.run_row(row, venv, run.copts, log=run.log)
    run.state["row"] = {
        "verdict": run.record["verdict"],
        "tiers": run_summary(run.record),
        "record": str(run.out_dir / ROW_FILE),
        "seconds": record_seconds(run.record),
    }
    run.searched = run.state["row"]


def search_installable(run: CanaryRun) -> None:
    """Step 1b: the canary's newest releases cannot install: name why, find the first that cannot, and search the
    tiers of the newest that does instead (its run, filed as <canary>-at-<package>-<release>, is what the rest
    reads)."""
    state, before, opts, log = run.state, run.before, run.opts, run.log
    state["install"] = None
    install = run.record.get("install") or {}
    if not (install.get("verdict") == "failed" and installable.is_conflict(install.get("failure")) and run.res.moved):
        return
    done = before["install"] if opts.resume and (before["install"] or {}).get("installable") else None
    if done is not None:
        log(f"[{run.res.canary.id}] reusing the install search of {CANARY_FILE} (--resume)")
    state["install"] = done or installable.canary_search(
        run.res, run.record, opts, run.probes_run, run.budget.spent, log=log
    )
    run.save()
    fallback = state["install"].get("installable")
    if fallback and (why := run.budget.spent()):
        state["install"]["run"] = {"stopped": why}
    elif fallback:
        run.res, run.record, run.copts, run.searched = installable.run_installable(
            run.res, fallback, opts, run.repo, log=log
        )
        run.searched["tiers"] = run_summary(run.record)
        state["install"]["run"] = run.searched
    run.save()


def read_tiers(run: CanaryRun) -> None:
    """Step 2: the record judged as the report judges it; the tiers it breaks, against the pinned row's baseline,
    and those that failed without proving anything."""
    state, record, c = run.state, run.record, run.res.canary
    state["abi"] = abi_statement(record)
    state["held"] = (record.get("install") or {}).get("held") or []
    state["moved_unasked"] = [m for m in (record.get("install") or {}).get("moved") or [] if m["why"] != "asked for"]
    canary_tiers = bisect.judged(record).get("tiers") or {}  # judged as the report judges it
    broken = baseline.broken_tiers(canary_tiers)
    base = (
        baseline.pinned_baseline(run.opts.results, c.base.id, broken, against=record)
        if broken
        else baseline.Baseline(c.base.id)
    )
    state["pinned"] = base.as_dict()
    state["broken_tiers"] = run.broken = broken
    # only a baseline that passed the tier makes the pins a known good end; else the search probes them
    run.pins_pass = base.run is not None
    # failed without proving anything (a harness failure, pytest stopped early): no release to blame
    state["not_proven"] = {
        t: not_proven_why(canary_tiers[t], t)
        for t in bisect.CHEAPEST
        if t in canary_tiers
        and canary_tiers[t].get("verdict") in FAILING
        and expected.tier_state(canary_tiers[t]) == expected.NOT_PROVEN
    }
    run.save()


def search_culprit(run: CanaryRun) -> None:
    """Step 3: which moved package breaks the cheapest broken tier (find_culprit over real probes)."""
    res, c = run.res, run.res.canary
    if not run.broken or not res.moved:
        return
    tier = run.broken[0]
    # what breaks in the canary: a probe counts as good only if it ran these and they passed
    breaking = bisect.failing_checks(run.record, tier)

    def probe_for(package: str, also: list[str]):
        spec = bisect.ProbeSpec(
            c.base,
            package,
            tier,
            run_id=run.probes_run,
            results=run.opts.results,
            cache=run.repo / ".cache" / "bisect",
            also=tuple(also),
            reuse=True,
        )
        return bisect.make_probe(spec, log=run.log, breaking=breaking)

    known = {}
    if c.override and len(res.moved) == 1 and not run.opts.overrides:  # the canary run is that package's probe
        ((pkg, (_, new)),) = res.moved.items()
        known[pkg] = bisect.classify_record(
            run.record, tier, new, run.searched["seconds"], run.searched["record"], breaking=breaking
        )
    run.state["culprit"] = find_culprit(
        res, tier, probe_for, bisect.candidates, run.budget, log=run.log, known=known, pins_pass=run.pins_pass
    )
    run.save()


def retry_blocking_pins(run: CanaryRun) -> None:
    """Step 4: each pin sglang holds that a failing check names, retried with that companion moved too."""
    state, c, log = run.state, run.res.canary, run.log
    state["blocking"] = []
    for b in (run.record.get("blocking_pins") or []) if c.override else []:
        if why := run.budget.spent():
            state["blocking"].append({**b, "retry": {"stopped": why}})
            break
        done = next(
            (
                x["retry"]
                for x in run.before["blocking"] or ()
                if x.get("package") == b["package"]
                and (x.get("retry") or {}).get("record")
                and Path(x["retry"]["record"]).exists()
            ),
            None,
        )
        if run.opts.resume and done is not None:
            log(f"[{c.id}] retry with {done.get('companion')}: reusing {done['record']} (--resume)")
        state["blocking"].append(
            {
                **b,
                "retry": done
                if run.opts.resume and done is not None
                else retry_with_companion(run.res, run.record, b, run.copts, run.repo, log),
            }
        )
        run.save()


def retry_with_companion(
    res: Resolution, record: dict, blocker: dict, copts: matrix.Options, repo: Path, log: Callable[[str], None]
) -> dict:
    """Re-run the canary with the blocking companion moved to the release uv picks next to the overrides."""
    c = res.canary
    pkg = blocker["package"]
    venv = bisect.make_venv(c.base, repo / ".nox" / f"canary-{c.id}-and-{pkg}")
    try:
        moved_to = matrix.resolve_companions(c.base, venv, copts.overrides, [pkg])
    except RowError as exc:
        return {"outcome": "no-release", "detail": str(exc)}
    if not moved_to or moved_to[0] == f"{pkg}=={blocker['version']}":
        return {
            "outcome": "no-release",
            "detail": f"no other release of {pkg} fits {', '.join(copts.overrides)} "
            f"on the index (uv keeps {pkg} {blocker['version']})",
        }
    rid = f"{c.id}-and-{canonicalize_name(pkg)}"
    opts2 = matrix.Options(
        **{
            **copts.__dict__,
            "overrides": [*copts.overrides, *moved_to],
            "record_extra": {"canary": {**res.as_dict(), "retry_of": c.id, "companion": moved_to[0]}},
        }
    )
    store = RunStore(copts.results, copts.run_id)
    if copts.resume and store.finished(rid):
        rec2 = store.load_row(rid)
    else:
        rec2 = matrix.run_row(dataclasses.replace(c.base, id=rid), venv, opts2, log=log)
    return {
        "outcome": rec2["verdict"],
        "companion": moved_to[0],
        "tiers": run_summary(rec2),
        "abi": abi_statement(rec2),
        "blocking_pins": rec2.get("blocking_pins") or [],
        "failure": next((f for t in bisect.CHEAPEST if (f := first_failure(rec2.get("tiers") or {}, t))), None),
        "record": str(Path(copts.results) / copts.run_id / rid / ROW_FILE),
        "seconds": record_seconds(rec2),
    }
