"""A canary's culprit search and its answer: which moved package breaks a tier (the probes injected, so it is tested
without installing anything), and the lines that say what the canary found (canary.json's ``summary``, the nox
session's last word). The canary's run itself is runner/canary_run.py; its command line runner/culprit.py."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from mtpmatrix.core.schema import FAILING
from mtpmatrix.runner import bisect, installable
from mtpmatrix.runner.canary import Resolution

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
