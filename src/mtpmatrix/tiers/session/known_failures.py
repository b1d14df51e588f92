"""Known-upstream failures in pytest's own words: xfailed, with the entry's id and link as the reason.

A check that fails the way a known_upstream.json entry describes is not this project's failure and not a
regression of the release under test; a red ``FAILED`` line for it reads as one. So the plugin's makereport hook,
which has just recorded the failure (kind, message, first frame, metrics), matches it against the list at once
(``match``) and, on a match, turns the report into what pytest's own xfail makes of a failing test: outcome
``skipped`` with ``wasxfail = "<entry id>: <link>"``. The terminal shows ``x``/``XFAIL``, the summary ``N xfailed``,
``-rx`` an ``XFAIL <check> - <id>: <link>`` line, junit.xml a ``<skipped type="pytest.xfail">``; an unmatched failure
stays ``FAILED``. The check's record is written before the report changes and keeps the failure whole: tiers.json
says exactly what it said before, and its tags and verdicts are still derived at the session's end by the one
derivation (expected.judge_tiers).

In the makereport hook the match can only see the checks that ran before: an entry whose signature needs a check
``passed_beside`` it that runs later does not match yet, and a check that passed may still become an error in its
teardown. ``reconcile`` puts the terminal right at the session's end, from the judged tiers: each failing report
reads xfailed exactly when its check carries a known-upstream tag, and the exit status follows (0 when no
failure is left). Only the progress letter of such a check, printed while it ran, may say otherwise.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core.known_upstream import KnownIssue
from mtpmatrix.core.record_types import CheckRecord

# The reports of each check that failed (setup, call or teardown), whether they now read as failures or xfails:
# what reconcile() puts right; keyed by node id.
FAILING_REPORTS_KEY = pytest.StashKey[dict]()
_ORIGINAL = "_mtpmatrix_failed_as"  # on a turned report: the outcome it had ('failed'), so it can go back


def reason(issue: KnownIssue) -> str:
    """The xfail reason: what the terminal, ``-rx`` and junit.xml show of the entry."""
    return f"{issue.id}: {issue.upstream}"


def match(
    issues: list[KnownIssue], versions: dict, record: CheckRecord, tier_records: list[CheckRecord]
) -> KnownIssue | None:
    """The first entry of ``issues`` that explains ``record`` (a failing check of the session), by the same test
    known_upstream.apply makes: the entry's tier and affected range, and its signature beside ``tier_records``
    (the records of the tier so far)."""
    for issue in issues:
        if issue.tier == record.get("tier") and issue.applies_to(versions) and issue.matches(record, tier_records):
            return issue
    return None


def turn(report, why: str) -> None:
    """``report`` (a failed one) as pytest's xfail reports a failing test: skipped, ``wasxfail`` the reason."""
    setattr(report, _ORIGINAL, report.outcome)
    report.outcome = "skipped"
    report.wasxfail = why


def _turn_back(report) -> None:
    report.outcome = getattr(report, _ORIGINAL)
    delattr(report, "wasxfail")
    delattr(report, _ORIGINAL)


def _category(report) -> str:
    """The terminal's stats key for a failed report (as pytest_report_teststatus files it)."""
    return "failed" if report.when == "call" else "error"


def _move(stats: dict, report, src: str, dst: str) -> None:
    kept = [r for r in stats.get(src, []) if r is not report]
    if kept or src in stats:
        stats[src] = kept
    stats.setdefault(dst, []).append(report)


def reconcile(session, tiers: dict, issues: list[KnownIssue]) -> None:
    """Each failing report of the session reads xfailed exactly when its check's judged record in ``tiers`` carries a
    known-upstream tag (and failed otherwise); ``session.exitstatus`` follows when it was 0 or 1."""
    failing = session.config.stash.get(FAILING_REPORTS_KEY, {})
    if not failing:
        return
    tags = {c["id"]: c.get("known_upstream") for t in tiers.values() for c in t.get("checks") or []}
    by_id = {i.id: i for i in issues}
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = tr.stats if tr is not None else {}
    for nodeid, reports in failing.items():
        issue = by_id.get(tags.get(nodeid) or "")
        for rep in reports:
            if issue is not None and not hasattr(rep, "wasxfail"):
                turn(rep, reason(issue))
                _move(stats, rep, _category(rep), "xfailed")
                session.testsfailed -= 1
            elif issue is None and hasattr(rep, _ORIGINAL):
                _turn_back(rep)
                _move(stats, rep, "xfailed", _category(rep))
                session.testsfailed += 1
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if session.testsfailed > 0 else pytest.ExitCode.OK


def terminal_summary(tr, tiers: dict) -> None:
    """After pytest's own summary sections: the known-upstream failures' tracebacks (pytest shows none for an
    xfail; the log keeps them, as it kept them as failures), and each entry a passing check says can go."""
    xfailed = [r for r in tr.stats.get("xfailed", []) if hasattr(r, _ORIGINAL)]
    if xfailed and tr.config.getoption("tbstyle", "auto") != "no":
        tr.write_sep("=", "known upstream failures (xfailed)")
        for rep in xfailed:
            tr.write_sep("_", f"{rep.head_line or rep.nodeid} [{rep.wasxfail}]")
            rep.toterminal(tr._tw)
    stale = [(k, t) for t in tiers.values() for k in t.get("stale_known_upstream") or []]
    if stale:
        tr.write_sep("=", "known upstream entries that can go")
        for entry, _tier in stale:
            # pytest's strict xfail would fail here; the project lists it (summary_line, the report) and goes on
            tr.write_line(
                f"XPASS {entry['id']}: {len(entry['checks'])} of its checks pass with {entry['package']} "
                f"{entry['version']} ({', '.join(entry['checks'])}); {entry['upstream']}"
            )
    unshown = [k for t in tiers.values() for k in t.get("unshown_known_upstream") or []]
    if unshown:
        tr.write_sep("=", "known upstream entries that did not show (batch timing: a pass is not a fix)")
        for entry in unshown:
            tr.write_line(
                f"XPASS {entry['id']}: {len(entry['checks'])} of its checks pass ({', '.join(entry['checks'])}); it "
                f"shows only when {entry['shows_when']}"
            )
