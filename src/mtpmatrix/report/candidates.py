"""Candidates beside their base release (runner/candidate.py): for each candidate row of a run, its base release's
record -- the row of the same run, else the baseline run's (``--baseline``) -- and, check by check, what the
candidate fixed (failed there, or known upstream, and passes now), broke (passed there, fails now) or left unchanged,
and which known-upstream entries no longer apply to it. The comparison is compare.compare_row's, the one every
baseline comparison makes.

A known-upstream entry that a candidate's checks pass inside its range says the candidate fixes it, not that the
entry can go: the release it names still has the bug. The run's "entry can go" list leaves candidate rows out.
Unless the entry's bug shows only under a condition the run does not control (its ``shows_when``): then a pass says
only that it did not show, on the candidate as on a release. Such an entry is listed as not shown (``did_not_show``),
never as no longer applying, and each check the candidate fixed where the base had that entry's tag says so
(``unshown``: the entry's id)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.schema import FAILING
from mtpmatrix.report import compare

FIXED, BROKEN, UNCHANGED = "fixed", "broken", "unchanged"
SHOWN_DELTAS = 12  # metric changes listed per candidate (summary.json keeps them all)


def candidate_of(record: RowRecord | None) -> dict[str, Any] | None:
    cand = (record or {}).get("candidate")
    return cand if isinstance(cand, dict) and isinstance(cand.get("base_row"), str) else None


def describe(cand: dict[str, Any]) -> str:
    """'patch 1a2b3c4 on sglang-0.5.17', 'wheel 1a2b3c4 (sglang 0.5.18.dev0)', 'checkout 1a2b3c4-dirty ...'."""
    kind = cand.get("kind") or "candidate"
    ident = (
        (cand.get("commit") or "")[:7] + ("-dirty" if cand.get("dirty") else "")
        if kind == "checkout"
        else (cand.get("sha256") or "")[:7]
    )
    version = f" (sglang {cand['version']})" if cand.get("version") else ""
    phase = cand.get("draft_phase")
    declared = f", draft phase {phase:+d} declared" if isinstance(phase, int) else ""
    return f"{kind} {ident}{version} on {cand['base_row']}{declared}"


def headline_text(rows: dict[str, RowRecord]) -> str:
    """The candidates a verdict is about, for its headline: 'candidate X (patch 1a2b3c4 on sglang-0.5.17)'."""
    names = [f"{rid} ({describe(c)})" for rid, rec in sorted(rows.items()) if (c := candidate_of(rec))]
    return f"candidate{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else ""


def section(
    run_dir: Path,
    rows: dict[str, RowRecord],
    baseline_dir: Path | None = None,
    baseline_rows: dict[str, RowRecord] | None = None,
) -> list[dict[str, Any]]:
    """One entry per candidate row of the run (``rows``: judged records), set beside its base release."""
    out = []
    for rid, rec in sorted(rows.items()):
        cand = candidate_of(rec)
        if cand is None:
            continue
        base_id = cand["base_row"]
        here = rows.get(base_id)
        if here is not None and here.get("tiers") and not here.get("unreadable"):
            base, base_dir, where = here, Path(run_dir), "this run"
        elif baseline_rows and baseline_dir is not None and base_id in baseline_rows:
            base, base_dir, where = baseline_rows[base_id], Path(baseline_dir), f"baseline {Path(baseline_dir).name}"
        else:
            base, base_dir, where = None, None, None
        out.append(beside(rid, rec, cand, base, where, Path(run_dir), base_dir))
    return out


def _tier_entries(
    rec: RowRecord, key: Literal["stale_known_upstream", "unshown_known_upstream"]
) -> list[dict[str, Any]]:
    """The known-upstream entries listed under ``key`` in ``rec``'s tiers, each with its tier."""
    return [dict(k, tier=t) for t, e in (rec.get("tiers") or {}).items() for k in e.get(key) or []]


def beside(
    rid: str,
    rec: RowRecord,
    cand: dict[str, Any],
    base: RowRecord | None,
    where: str | None,
    run_dir: Path,
    base_dir: Path | None,
) -> dict[str, Any]:
    """A candidate against its base release's record, check by check."""
    entry: dict[str, Any] = {
        "row": rid,
        "candidate": cand,
        "describe": describe(cand),
        "base_row": cand["base_row"],
        "base_from": where,
        "verdict": rec.get("verdict"),
        "no_longer_applies": _tier_entries(rec, "stale_known_upstream"),
        "did_not_show": _tier_entries(rec, "unshown_known_upstream"),
    }
    if base is None or base_dir is None:
        entry["missing_base"] = (
            f"no record of {cand['base_row']} in this run or a baseline: run the base release "
            "beside the candidate (same --run-id), or give --baseline RUN_ID"
        )
        entry.update(
            counts={FIXED: 0, BROKEN: 0, UNCHANGED: 0}, fixed=[], broken=[], new_failures=[], tiers={}, metric_deltas=[]
        )
        return entry
    cmp = compare.compare_row(rid, rec, base, run_dir / rid, Path(base_dir) / cand["base_row"])
    # a check the base failed with a bug that shows only under a condition (shows_when) and passes now: not a fix
    intermittent = {
        k["id"]
        for e in (base.get("tiers") or {}).values()
        for k in e.get("known_upstream") or []
        if k.get("shows_when")
    }
    fixed = [
        dict(i, unshown=i["before_known_upstream"]) if i["before_known_upstream"] in intermittent else i
        for i in cmp["fixed"]
    ]
    broken = [i for i in cmp["new_failures"] if i["before"] == "passed"]
    # failing now where the base did not run the check (skipped there, or no such check): not a comparison
    unmatched = [i for i in cmp["new_failures"] if i["before"] != "passed"]
    before = {c["id"]: c.get("outcome") for e in (base.get("tiers") or {}).values() for c in e.get("checks") or []}
    moved = {i["check"] for i in fixed + broken}
    # checks both ran (a check skipped on either side compares nothing) that pass or fail on both sides
    unchanged = [
        c["id"]
        for e in (rec.get("tiers") or {}).values()
        for c in e.get("checks") or []
        if before.get(c["id"], "skipped") != "skipped"
        and c.get("outcome") != "skipped"
        and c["id"] not in moved
        and (c.get("outcome") in FAILING) == (before[c["id"]] in FAILING)
    ]
    # what a candidate changes, not how long a check took: timings stay in the baseline comparison's table
    deltas = sorted(
        (d for d in cmp["metric_deltas"] if "seconds" not in d["metric"]), key=lambda d: d["check"] not in moved
    )  # the moved checks' first
    entry.update(
        counts={FIXED: len(fixed), BROKEN: len(broken), UNCHANGED: len(unchanged)},
        fixed=fixed,
        broken=broken,
        new_failures=unmatched,
        tiers=cmp["entry"]["tiers"],
        base_verdict=base.get("verdict"),
        metric_deltas=deltas,
    )
    return entry


def markdown(items: list[dict[str, Any]]) -> str:
    """The candidates' section of summary.md; what it takes from records escaped (report/md.py)."""
    from mtpmatrix.report.checks import short_check
    from mtpmatrix.report.md import code
    from mtpmatrix.report.md import escape as e

    lines = ["## Candidates", ""]
    for c in items:
        base = f"**{e(c['base_row'])}**" + (f" ({e(c['base_from'])})" if c.get("base_from") else "")
        files = c["candidate"].get("files") or []
        lines.append(
            f"**{e(c['row'])}**: {e(c['describe'])}"
            + (f"; files {e(', '.join(map(str, files)))}" if files else "")
            + f" — against {base}"
        )
        lines.append("")
        if c.get("missing_base"):
            lines += [f"- ❔ {e(c['missing_base'])}", ""]
        else:
            n = c["counts"]
            lines += [
                f"{n[FIXED]} fixed, {n[BROKEN]} broken, {n[UNCHANGED]} unchanged (check by check, against "
                f"{e(c['base_row'])})",
                "",
            ]
            changed = [(t, v) for t, v in c["tiers"].items() if v.get("change") != "same"]
            if changed:
                lines += ["| tier | base | candidate | change |", "|---|---|---|---|"]
                lines += [
                    f"| {e(t)} | {e(v['before'] or '—')} | {e(v['after'] or '—')} | {e(v['change'])} "
                    f"({e(v['label'])}) |"
                    for t, v in changed
                ] + [""]
        for i in c["fixed"]:
            was = "known upstream" if i.get("before_known_upstream") else i["before"]
            why = f"; {code(i['unshown'])} did not show: not evidence of a fix" if i.get("unshown") else ""
            lines.append(
                f"- 🔺 fixed **{e(i['tier'])}** {e(short_check(i['check']))} ({e(was)} in {e(c['base_row'])}, "
                f"passes now{why})"
            )
        for i in c["broken"]:
            lines.append(
                f"- 🔻 broken **{e(i['tier'])}** {e(short_check(i['check']))}: {code(i.get('kind') or '?')} "
                + e(" ".join(str(i.get("message") or "").split())[:240])
            )
        for i in c["new_failures"]:
            lines.append(
                f"- ❌ fails, not run in {e(c['base_row'])}: **{e(i['tier'])}** {e(short_check(i['check'] or ''))}: "
                f"{code(i.get('kind') or '?')} " + e(" ".join(str(i.get("message") or "").split())[:240])
            )
        for k in c["no_longer_applies"]:
            lines.append(
                f"- 🧹 known upstream {code(k['id'])} no longer applies to the candidate: {len(k['checks'])} of "
                f"its checks pass ({e(k['tier'])}); {e(c['base_row'])} still has it"
            )
        for k in c.get("did_not_show") or []:
            lines.append(
                f"- 🔸 known upstream {code(k['id'])} did not show in the candidate ({len(k['checks'])} of its checks "
                f"pass, {e(k['tier'])}): it shows only when {e(k['shows_when'])} — a pass is not evidence of a fix"
            )
        for d in c["metric_deltas"][:SHOWN_DELTAS]:
            lines.append(
                f"- {e(d['tier'])} {e(short_check(d['check']))} {e(d['metric'])}: {e(d['before'])} → {e(d['after'])}"
            )
        if len(c["metric_deltas"]) > SHOWN_DELTAS:
            lines.append(f"- … {len(c['metric_deltas']) - SHOWN_DELTAS} more metric changes in summary.json")
        lines.append("")
    return "\n".join(lines) + "\n"
