"""A canary's run and, when it breaks, its culprit: which package, which release, which tier, what failure.

    nox -t canary [-- --tiers contract --budget 1800 --resume]
    python -m mtpmatrix canary [ID ...] [--tiers ...] [--budget S] [--run-id RUN] [--resume]

Steps, each recorded in ``results/<run>/<canary>/canary.json`` (atomic; ``--resume`` continues from it):

1. resolve the canary (``canary.resolve``: index first, one line on bad input) and run it as a row
   (``matrix.run_row``, the one install helper) in ``.nox/canary-<id>``;
1b. when the canary cannot install (a resolver conflict): name the conflicting requirements, bisect its releases
   on install-ability alone (``runner/installable.py``, uv's resolution, no venv) and run the newest that installs
   as the row whose tiers the next steps read;
2. judge its record again and read each tier as the report does (expected.tier_state): a tier it breaks is to
   be blamed on the moved packages only against a baseline, the pinned row's latest run that passed it
   (runner/baseline.py; runs that proved nothing are passed over); a tier that failed without proving anything (a
   harness failure, pytest stopped early) blames nothing and says so;
3. for the cheapest tier the canary breaks: probe every moved package alone on the pinned row at the canary's
   release (``bisect.make_probe``); bisect each package whose probe fails between its pin and the canary's release
   (``bisect.search``, the same search as ``nox -s bisect``; the pin is a known good end only with a baseline,
   else it is probed, and a pin that fails too blames nothing); when no package fails alone, probe the pairs, then
   name the set that breaks together;
4. ``canary-override``: each pin sglang holds that a failing check names (``overrides.blocking_pins``) is its own
   finding; the canary is re-run with that companion moved too (``matrix.resolve_companions``), and that run's
   verdicts are reported.

``--budget S`` bounds steps 3-4 (wall seconds from the start of the search): the search stops before a probe that
would start past it and says how far it got. Probes land in ``results/bisect-<run>-<canary>/`` (outside the matrix
run the report reads), their venvs under ``.cache/bisect/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix.core import expected, paths
from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.evidence import fingerprint, manifest
from mtpmatrix.core.rows import RowError, load_rows
from mtpmatrix.core.schema import FAILING, ROW_FILE
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import baseline, bisect, installable, matrix, plan
from mtpmatrix.runner.canary import Canary, Resolution, canary_row, describe_resolution, load_canaries, resolve
from mtpmatrix.runner.probe import not_proven_why
from mtpmatrix.runner.releases import ReleaseError

CANARY_FILE = "canary.json"
ABI_CHECKS = ("test_torch_abi", "test_cuda_major")


def first_failure(tiers: dict, tier: str) -> dict | None:
    for c in (tiers.get(tier) or {}).get("checks") or []:
        if c.get("outcome") in FAILING and c.get("failure"):
            return {"check": c.get("id"), **c["failure"]}
    return None


def abi_statement(record: dict) -> str | None:
    """Whether the row's torch breaks sglang's native extensions, from the contract tier's ABI checks."""
    checks = [
        c
        for c in ((record.get("tiers") or {}).get("contract") or {}).get("checks") or []
        if any(a in (c.get("id") or "") for a in ABI_CHECKS)
    ]
    if not checks:
        return None
    torch = (record.get("versions") or {}).get("torch", "?")
    bad = [c for c in checks if c.get("outcome") in FAILING]
    if bad:
        return f"torch {torch} breaks native extensions (contract ABI check): " + "; ".join(
            (c.get("failure") or {}).get("message", "")[:300] for c in bad
        )
    ran = [c for c in checks if c.get("outcome") == "passed"]
    if not ran:
        return f"ABI check did not run under torch {torch} ({', '.join(c.get('outcome', '?') for c in checks)})"
    m = next((c.get("metrics") or {} for c in ran if "test_torch_abi" in c.get("id", "")), {})
    size = (
        f" ({m['libraries']} torch-linked libraries, {m['torch_symbols']} torch symbols)" if m.get("libraries") else ""
    )
    return f"torch {torch} does not break sglang's native extensions: the ABI checks pass{size}"


class Budget:
    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock, self.t0 = seconds, clock, clock()

    def spent(self) -> str | None:
        if self.seconds is not None and self.clock() - self.t0 >= self.seconds:
            return f"--budget {self.seconds:.0f} s spent"
        return None


# ---------------------------------------------------------------------------------------------------------------
# the search (probes injected: tested without installing anything)
# ---------------------------------------------------------------------------------------------------------------


def find_culprit(
    res: Resolution,
    tier: str,
    probe_for: Callable[[str, list[str]], Callable[[str], bisect.Probe]],
    candidates: Callable[[str, str, str], list[str]],
    budget: Budget,
    log: Callable[[str], None] = print,
    known: dict[str, bisect.Probe] | None = None,
    pins_pass: bool = False,
) -> dict:
    """Which moved package breaks ``tier``: single-package probes, then a bisect of each failing one, else pairs.

    ``probe_for(package, also)`` returns a probe of the pinned row with ``package==version`` (+ ``also``);
    ``candidates(package, good, bad)`` lists the releases between the pin and the canary's release; ``known``:
    single-package results already measured (a canary-override that moved one package is that probe);
    ``pins_pass``: the pinned row itself passed ``tier`` (a finished record), so every pin is a known good end."""
    out: dict = {"tier": tier, "single": {}, "bisect": {}, "together": None, "stopped": None}
    bad_alone = []
    for pkg, (_pin, new) in res.moved.items():
        if why := budget.spent():
            out["stopped"] = why
            return out
        p = (known or {}).get(pkg)
        if p is None:
            log(f"[culprit] {pkg} {new} alone on {res.canary.base.id} ({tier})")
            p = probe_for(pkg, [])(new)
        out["single"][pkg] = {
            "version": new,
            "status": p.status,
            "detail": p.detail,
            "failure": p.failure,
            "record": p.record,
            "seconds": round(p.seconds, 1),
        }
        if p.status == bisect.BAD:
            bad_alone.append(pkg)
    for pkg in bad_alone:
        pin, new = res.moved[pkg]
        if pin is None:
            out["bisect"][pkg] = {"outcome": "no-pin", "summary": [f"{pkg} has no pin in the row to bisect from"]}
            continue
        try:
            cands = candidates(pkg, pin, new)
        except bisect.BisectError as exc:
            out["bisect"][pkg] = {"outcome": "error", "summary": [str(exc)]}
            continue
        found = bisect.search(
            cands,
            probe_for(pkg, []),
            log=log,
            should_stop=budget.spent,
            known={new: bisect.BAD, **({pin: bisect.GOOD} if pins_pass else {})},
        )
        found.seconds = max(found.seconds, sum(p.seconds for p in found.probes))  # reused probes keep their time
        out["bisect"][pkg] = {**found.as_dict(), "summary": bisect.describe(found, pkg)}
        if found.outcome == "stopped":
            out["stopped"] = found.stopped
            return out
    if not bad_alone and len(res.moved) > 1 and all(s["status"] == bisect.GOOD for s in out["single"].values()):
        moved = list(res.moved)
        for a, b in itertools.combinations(moved, 2):
            if len(moved) == 2:  # the pair is the canary itself, which failed
                out["together"] = {"packages": [a, b], "status": bisect.BAD, "detail": "each alone passes"}
                break
            if why := budget.spent():
                out["stopped"] = why
                return out
            p = probe_for(a, [f"{b}=={res.moved[b][1]}"])(res.moved[a][1])
            if p.status == bisect.BAD:
                out["together"] = {"packages": [a, b], "status": p.status, "detail": p.detail, "record": p.record}
                break
        else:
            out["together"] = {
                "packages": moved,
                "status": bisect.BAD,
                "detail": "each alone and every pair passes; only all of them together fail",
            }
    return out


def culprit_lines(c: dict, res: Resolution) -> list[str]:
    """The answer, a few lines."""
    row, tier = res.canary.base.id, c["tier"]
    out = []
    for pkg, s in c["single"].items():
        out.append(
            f"{pkg} {s['version']} alone on {row}: {s['status'].upper()}" + (f" — {s['detail']}" if s["detail"] else "")
        )
    for pkg, b in c["bisect"].items():
        pin = (res.moved.get(pkg) or (None, None))[0]
        if b.get("outcome") == "good-fails" and b.get("first_bad") == pin:  # no baseline: the pins were probed
            out.append(f"{row} fails {tier} at its own pin too ({pkg} {pin}): nothing to blame on {pkg}")
        elif b.get("outcome") in ("found", "good-fails"):
            f = (
                (next((p for p in b["probes"] if p["version"] == b["first_bad"]), None) or {}).get("failure")
                or (c["single"].get(pkg, {}) if c["single"].get(pkg, {}).get("version") == b["first_bad"] else {}).get(
                    "failure"
                )
                or {}
            )
            out.append(
                f"CULPRIT: {pkg} {b['first_bad']} breaks {row} {tier} (last good: {b['last_good'] or '-'}): "
                f"[{f.get('kind') or '?'}] {f.get('message') or ''}".rstrip()
            )
        out += [f"  {ln}" for ln in b.get("summary") or []]
    if c.get("together"):
        out.append(
            f"CULPRIT: {' + '.join(c['together']['packages'])} break {row} {tier} only together "
            f"({c['together']['detail']})"
        )
    if c.get("stopped"):
        out.append(f"search stopped: {c['stopped']} (resume with --resume to go on)")
    if not out:
        out.append("no package moved: nothing to blame")
    return out


# ---------------------------------------------------------------------------------------------------------------
# blocking pins: retry with the companion moved too
# ---------------------------------------------------------------------------------------------------------------


def blocker_lines(record: dict, res: Resolution) -> list[str]:
    torch = ", ".join(res.overrides) or "the canary's releases"
    return [
        f"BLOCKING PIN: {b['pinned_by']} pins {b['package']}=={b['version']}, which refuses {torch} "
        f"({b['tier']} {b['check'].split('::')[-1] if b.get('check') else ''}: [{b.get('kind')}] "
        f"{_clip(b['message'])})"
        for b in record.get("blocking_pins") or []
    ]


def _clip(text: str, n: int = 240) -> str:
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


def verdict_line(state: dict, res: Resolution) -> str | None:
    """The one-line answer when a blocking pin, moved too, makes the canary pass: the upgrade itself works and the
    pin is what blocks it (the upgrade's own failure would otherwise read as a break in sglang)."""
    cleared = [b for b in state.get("blocking") or [] if (b.get("retry") or {}).get("outcome") == "passed"]
    if not cleared or state["row"]["verdict"] not in FAILING:
        return None
    pins = ", ".join(f"{b['package']}=={b['version']}" for b in cleared)
    moved = ", ".join(b["retry"]["companion"] for b in cleared)
    return (
        f"ANSWER: {', '.join(res.overrides)} works with {res.canary.base.id} once {moved} moves too "
        f"({cleared[0]['retry']['tiers']}): the upgrade is blocked only by {cleared[0]['pinned_by']}'s pin {pins}"
    )


# a row's own install + suite time (what a resumed canary reads back instead of timing the read)
record_seconds = installable.record_seconds


def run_summary(record: dict) -> str:
    return "; ".join(
        f"{t}={v['verdict']}" + (f" [{','.join(v.get('failure_kinds') or [])}]" if v.get("failure_kinds") else "")
        for t, v in (record.get("tiers") or {}).items()
        if v.get("verdict") != "skipped"
    ) or f"install {((record.get('install') or {}).get('verdict'))}" + (
        f": {_clip(f['message'])}" if (f := (record.get("install") or {}).get("failure") or {}).get("message") else ""
    )


# ---------------------------------------------------------------------------------------------------------------
# the whole canary (real installs)
# ---------------------------------------------------------------------------------------------------------------


def run_canary(
    res: Resolution,
    opts: matrix.Options,
    *,
    repo: Path = paths.REPO,
    budget_s: float | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run one resolved canary and, when it breaks a tier its pinned row passes, its culprit search."""
    c: Canary = res.canary
    store = RunStore(opts.results, opts.run_id)
    out_dir = store.row_dir(c.id)
    state_file = out_dir / CANARY_FILE
    state = read_json(state_file) if opts.resume and state_file.exists() else {}
    before = {k: state.get(k) for k in ("blocking", "seconds", "install")}  # a resumed run keeps what it measured
    state.update(
        canary=res.as_dict(),
        run_id=opts.run_id,
        resolution=describe_resolution(res),
        resumed=bool(opts.resume and before["seconds"] is not None),
    )
    log(state["resolution"])
    t0 = time.monotonic()

    def save():
        atomic_write_json(state_file, state)

    row = canary_row(res, out_dir / "resolved")
    copts = matrix.Options(
        **{
            **opts.__dict__,
            "overrides": [*opts.overrides, *(res.overrides if c.override else [])],
            "record_extra": {"canary": res.as_dict()},
        }
    )
    # the run plans the canary as resolved: its pins and its overrides (the report judges its record against them)
    manifest.ensure(
        store.path,
        opts.run_id,
        {c.id: manifest.planned_row(row.as_dict(), row.path.read_text(), copts.overrides)},
        plan.invocation(copts),
        fingerprint.describe(),
    )
    if opts.resume and store.finished(c.id):
        record = store.load_row(c.id)
        log(f"[{c.id}] reusing its finished row record (--resume)")
    else:
        venv = bisect.make_venv(row, repo / ".nox" / f"canary-{c.id}")
        record = matrix.run_row(row, venv, copts, log=log)
    state["row"] = {
        "verdict": record["verdict"],
        "tiers": run_summary(record),
        "record": str(out_dir / ROW_FILE),
        "seconds": record_seconds(record),
    }
    budget = Budget(budget_s)
    probes_run = paths.canary_probes_run(opts.run_id, c.id)
    # the canary's newest releases cannot install: name why, find the first that cannot, and search the tiers of
    # the newest that does instead (its run, filed as <canary>-at-<package>-<release>, is what the rest reads)
    state["install"] = None
    searched = state["row"]
    install = record.get("install") or {}
    if install.get("verdict") == "failed" and installable.is_conflict(install.get("failure")) and res.moved:
        done = before["install"] if opts.resume and (before["install"] or {}).get("installable") else None
        if done is not None:
            log(f"[{c.id}] reusing the install search of {CANARY_FILE} (--resume)")
        state["install"] = done or installable.canary_search(res, record, opts, probes_run, budget.spent, log=log)
        save()
        fallback = state["install"].get("installable")
        if fallback and (why := budget.spent()):
            state["install"]["run"] = {"stopped": why}
        elif fallback:
            res, record, copts, searched = installable.run_installable(res, fallback, opts, repo, log=log)
            searched["tiers"] = run_summary(record)
            state["install"]["run"] = searched
        save()
    state["abi"] = abi_statement(record)
    state["held"] = (record.get("install") or {}).get("held") or []
    state["moved_unasked"] = [m for m in (record.get("install") or {}).get("moved") or [] if m["why"] != "asked for"]
    canary_tiers = bisect.judged(record).get("tiers") or {}  # judged as the report judges it
    broken = baseline.broken_tiers(canary_tiers)
    base = (
        baseline.pinned_baseline(opts.results, c.base.id, broken, against=record)
        if broken
        else baseline.Baseline(c.base.id)
    )
    state["pinned"] = base.as_dict()
    state["broken_tiers"] = broken
    # failed without proving anything (a harness failure, pytest stopped early): no release to blame
    state["not_proven"] = {
        t: not_proven_why(canary_tiers[t], t)
        for t in bisect.CHEAPEST
        if t in canary_tiers
        and canary_tiers[t].get("verdict") in FAILING
        and expected.tier_state(canary_tiers[t]) == expected.NOT_PROVEN
    }
    save()

    # what breaks in the canary: a probe counts as good only if it ran these and they passed
    breaking = bisect.failing_checks(record, broken[0]) if broken else None

    def probe_for(package: str, also: list[str]):
        return bisect.make_probe(
            c.base,
            package,
            broken[0],
            run_id=probes_run,
            results=opts.results,
            cache=repo / ".cache" / "bisect",
            log=log,
            also=also,
            reuse=True,
            breaking=breaking,
        )

    if broken and res.moved:
        known = {}
        if c.override and len(res.moved) == 1 and not opts.overrides:  # the canary run is that package's probe
            ((pkg, (_, new)),) = res.moved.items()
            known[pkg] = bisect.classify_record(
                record, broken[0], new, searched["seconds"], searched["record"], breaking=breaking
            )
        # only a baseline that passed the tier makes the pins a known good end; else the search probes them
        state["culprit"] = find_culprit(
            res, broken[0], probe_for, bisect.candidates, budget, log=log, known=known, pins_pass=base.run is not None
        )
        save()
    state["blocking"] = []
    for b in (record.get("blocking_pins") or []) if c.override else []:
        if why := budget.spent():
            state["blocking"].append({**b, "retry": {"stopped": why}})
            break
        done = next(
            (
                x["retry"]
                for x in before["blocking"] or ()
                if x.get("package") == b["package"]
                and (x.get("retry") or {}).get("record")
                and Path(x["retry"]["record"]).exists()
            ),
            None,
        )
        if opts.resume and done is not None:
            log(f"[{c.id}] retry with {done.get('companion')}: reusing {done['record']} (--resume)")
        state["blocking"].append(
            {
                **b,
                "retry": done
                if opts.resume and done is not None
                else retry_with_companion(res, record, b, copts, repo, log),
            }
        )
        save()
    # wall time over every session of this canary: a resumed one adds what it spent to what was spent before
    state["seconds"] = round((before["seconds"] or 0.0) + time.monotonic() - t0, 1)
    state["summary"] = summary_lines(state, res, record)
    save()
    return state


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


def summary_lines(state: dict, res: Resolution, record: dict) -> list[str]:
    c = res.canary
    out = [state["resolution"], f"{c.id}: {state['row']['verdict'].upper()} — {state['row']['tiers']}"]
    if state.get("install"):  # res and record are then the run at the newest releases that install
        out += installable.lines(state["install"])
        run = state["install"].get("run") or {}
        if run.get("stopped"):
            out.append(f"  the releases that install: not run ({run['stopped']})")
        elif run:
            out.append(f"{run['id']}: {run['verdict'].upper()} — {run['tiers']} (the tiers are searched here)")
    for h in state.get("held") or []:
        out.append(f"held: {h['package']} {h['version']} ({h['why']})")
    for m in state.get("moved_unasked") or []:
        out.append(f"moved: {m['package']} {m['from'] or '-'} -> {m['to'] or '-'} ({m['why']})")
    if state.get("abi"):
        out.append(state["abi"])
    pinned = state.get("pinned") or {}
    if state["broken_tiers"]:
        tiers = ", ".join(state["broken_tiers"])
        out.append(
            f"breaks {tiers} that {c.base.id} passes (run {pinned['run']})"
            if pinned.get("run")
            else f"breaks {tiers}; no complete baseline run of {c.base.id} ({pinned.get('why') or 'none'}): the "
            f"search probes its pins itself"
        )
        if state.get("culprit"):
            out += culprit_lines(state["culprit"], res)
        if len(state["broken_tiers"]) > 1:  # one search per canary: the cheapest broken tier's
            first, rest = state["broken_tiers"][0], state["broken_tiers"][1:]
            pkg = next(iter((state.get("culprit") or {}).get("bisect") or res.moved), None)
            hint = (
                (f": nox -s bisect -- {pkg} {res.moved[pkg][0]} {res.moved[pkg][1]} --row {c.base.id} --tier {rest[0]}")
                if pkg in res.moved and res.moved[pkg][0]
                else ""
            )
            out.append(f"also breaks {', '.join(rest)}: searched on {first} only{hint}")
    for tier, why in (state.get("not_proven") or {}).items():
        out.append(f"{tier} not proven ({why}): nothing to blame on the moved packages")
    out += blocker_lines(record, res)
    for b in state.get("blocking") or []:
        r = b.get("retry") or {}
        if r.get("stopped"):
            out.append(f"  retry with {b['package']} moved: not run ({r['stopped']})")
        elif r.get("outcome") == "no-release":
            out.append(f"  retry with {b['package']} moved: {r['detail']}")
        else:
            f = r.get("failure") or {}
            out.append(
                f"  retry with {r['companion']}: {r['outcome'].upper()} — {r['tiers']}"
                + (f"; first failure [{f.get('kind')}] {_clip(f.get('message', ''))}" if f else "")
            )
            if r.get("abi"):
                out.append(f"    {r['abi']}")
    if answer := verdict_line(state, res):
        out.append(answer)
    out.append(
        f"{c.id}: {state['seconds']:.0f} s in all" + (" (over resumed sessions)" if state.get("resumed") else "")
    )
    return out


def outcome_line(state: dict, where: str) -> str:
    """What the canary found, one line (the nox session's last word): the install conflict it named, the culprit
    it found, or that it found none and why; ``where``: its canary.json."""
    parts = []
    for pkg, one in ((state.get("install") or {}).get("single") or {}).items():
        if one.get("status") == bisect.BAD:
            parts.append(f"{pkg} {one['version']} cannot install ({one['detail'].removeprefix('cannot install: ')})")
    for pkg, b in ((state.get("install") or {}).get("bisect") or {}).items():
        if b.get("outcome") == "found":
            parts.append(f"first that cannot: {pkg} {b['first_bad']}, newest that installs: {b['last_good']}")
    run = (state.get("install") or {}).get("run") or {}
    if run.get("verdict") and run["verdict"] not in FAILING:
        parts.append(f"{run['id']} {run['verdict']}: nothing breaks at the newest releases that install")
    summary = state.get("summary") or []
    culprits = [ln.removeprefix("CULPRIT: ") for ln in summary if ln.startswith("CULPRIT: ")]
    if culprits:
        parts.append("culprit: " + "; ".join(_clip(c, 160) for c in culprits))
    elif state.get("broken_tiers"):
        stopped = (state.get("culprit") or {}).get("stopped")
        parts.append(
            f"breaks {', '.join(state['broken_tiers'])}: no culprit found" + (f" ({stopped})" if stopped else "")
        )
    elif state.get("not_proven"):
        parts.append(f"{', '.join(state['not_proven'])} not proven: nothing to blame")
    install = state.get("install") or {}
    if install.get("stopped"):
        parts.append(f"install search stopped ({install['stopped']})")
    elif (install.get("run") or {}).get("stopped"):
        parts.append(f"the releases that install not run ({install['run']['stopped']})")
    if not parts:
        row = state.get("row") or {}
        parts.append(f"{row.get('verdict', '?')} ({row.get('tiers', '?')}): no culprit searched")
    return "; ".join(parts) + f" — details above and in {where}"


def publish(lines: list[str], env: dict | None = None) -> None:
    """Append the canary's answer to the GitHub step summary when there is one."""
    path = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as fh:
            fh.write("\n```\n" + "\n".join(lines) + "\n```\n")


# ---------------------------------------------------------------------------------------------------------------
# CLI (python -m mtpmatrix canary, nox -t canary)
# ---------------------------------------------------------------------------------------------------------------


def split_budget(posargs: list[str]) -> tuple[float | None, list[str]]:
    """``--budget S`` out of the session arguments; the rest are the matrix's (``matrix.parse_options``), pytest's
    after a second ``--`` handed on whole (a ``--budget`` there is pytest's)."""
    ours, pytest_args = matrix.split_pytest_args(posargs)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--budget", default=None)
    ns, rest = p.parse_known_args(ours)
    if "--" in posargs:
        rest = [*rest, "--", *pytest_args]
    if ns.budget is None:
        return None, rest
    try:
        budget = float(ns.budget)
    except ValueError:
        raise RowError(f"--budget wants seconds, got {ns.budget!r}") from None
    if budget <= 0:
        raise RowError(f"--budget must be positive, got {ns.budget}")
    return budget, rest


def main(
    ids: list[str],
    posargs: list[str],
    *,
    run_id: str | None = None,
    constraints: Path | None = None,
    log: Callable[[str], None] = print,
    outcomes: list[str] | None = None,
) -> int:
    """Resolve every selected canary (all before any venv), then run each with its culprit search.
    0: every canary passed; 1: a canary failed (its answer printed and in canary.json); 2: bad input.
    ``outcomes`` gains "<canary>: <outcome_line>" for each canary that failed."""
    constraints = constraints or paths.CONSTRAINTS_DIR
    try:
        canaries = load_canaries(constraints, load_rows(constraints))
        unknown = [i for i in ids if i not in canaries]
        if unknown:
            raise RowError(f"unknown canary {', '.join(unknown)}; known: {', '.join(canaries) or 'none'}")
        budget, rest = split_budget(posargs)
        opts = matrix.parse_options(rest)
        opts.run_id = opts.run_id or run_id or paths.new_run_id()
        matrix.preflight_overrides(opts.overrides, skip_index=opts.offline_check)
        matrix.preflight_tier_env(opts.tiers)
        resolved = [resolve(canaries[i]) for i in (ids or list(canaries))]
    except (RowError, ReleaseError) as exc:
        log(f"error: {exc}")
        return 2
    worst = 0
    for res in resolved:
        try:
            state = run_canary(res, opts, budget_s=budget, log=log)
        except (RowError, bisect.BisectError) as exc:
            log(f"error: {res.canary.id}: {exc}")
            return 2
        for line in state["summary"]:
            log(line)
        publish(state["summary"])
        if state["row"]["verdict"] in FAILING:
            worst = 1
            if outcomes is not None:
                where = RunStore(opts.results, opts.run_id).row_dir(res.canary.id) / CANARY_FILE
                outcomes.append(f"{res.canary.id}: {outcome_line(state, str(where))}")
    return worst


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ids", nargs="*", metavar="CANARY", help="canary ids (constraints/canary/*.txt; default: all)")


def run(ns: argparse.Namespace, rest: list[str]) -> int:
    return main(ns.ids, rest, log=lambda m: print(m, file=sys.stderr if m.startswith("error:") else sys.stdout))
