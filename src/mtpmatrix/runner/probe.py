"""One bisect probe's answer from its row record, judged as the report judges it.

A probe record is judged again first (``expected.rejudge_record``: its checks, its selection and the current
known-upstream list; whatever verdicts and tags it stored are some earlier run's), then read through
``expected.tier_state``, the one reading of a tier for every decision:

  BROKEN       bad: a failure sglang or its dependencies own
  PROVEN       good, unless a check that breaks at the bad end (``breaking``) did not run and pass here
  KNOWN_ONLY   its whole set ran and every failure is a listed upstream issue: good only when the checks that break
               at the bad end ran here and passed; otherwise its own state, ``known-only``, neither good nor bad (a
               listed bug may hide the break searched, or be it), set aside by the search like an untestable one
  NOT_PROVEN   untestable (a harness failure, beside a listed one or alone; pytest died; skipped), except a partial
               tier (nothing failed, part of the set did not run) that ran and passed every check that breaks

``classify_for_known`` answers a different question: where a known-upstream entry began (``bisect --known ID``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from mtpmatrix.core import expected
from mtpmatrix.core.schema import FAILING, PARTIAL, short_check_id

GOOD, BAD, UNTESTABLE = "good", "bad", "untestable"
KNOWN_ONLY = "known-only"  # ran and failed only on listed upstream issues; the checks that break did not all pass
STATUSES = (GOOD, BAD, UNTESTABLE, KNOWN_ONLY)


@dataclass
class Probe:
    version: str
    status: str  # STATUSES
    detail: str = ""  # one line: the failure, or why the release could not be tested
    failure: dict | None = None  # {kind, type, message, frame, raised_at} of the first failing check
    seconds: float = 0.0
    record: str | None = None  # row.json of the probe
    fatal: bool = False  # no release can be tested here (e.g. the tier needs a GPU this machine lacks): stop
    breaks: list[str] = field(default_factory=list)  # short ids of the checks failing here, listed issues aside
    known_upstream: list[str] = field(default_factory=list)  # ids of the listed issues its failures matched


def judged(record: dict, issues=None) -> dict:
    """A re-judged copy of a row record (the caller's record is left as it was)."""
    return expected.rejudge_record(copy.deepcopy(record), issues)


def _tier(record: dict, tier: str, issues=None) -> dict:
    return (judged(record, issues).get("tiers") or {}).get(tier) or {}


def _owned_failures(tier_entry: dict) -> list[dict]:
    """The failing checks no listed issue explains and the harness does not own: what a bisect searches for."""
    return [
        c
        for c in expected.unexplained_failures(tier_entry)
        if ((c.get("failure") or {}).get("kind") if isinstance(c.get("failure"), dict) else None) != expected.HARNESS
    ]


def failing_checks(record: dict, tier: str, issues=None) -> frozenset[str]:
    """The short ids of the checks that fail ``tier`` in a row record, judged again, listed upstream bugs and
    harness failures aside: what a bisect of that break searches for."""
    return frozenset(short_check_id(c["id"]) for c in _owned_failures(_tier(record, tier, issues)))


def known_ids(tier_entry: dict) -> list[str]:
    return [k.get("id", "?") for k in tier_entry.get("known_upstream") or []]


def not_proven_why(tier_entry: dict, tier: str) -> str:
    """Why a NOT_PROVEN tier proves nothing either way, one line."""
    verdict = tier_entry.get("verdict")
    beside = f"; known upstream {', '.join(known_ids(tier_entry))} beside it" if known_ids(tier_entry) else ""
    if verdict == PARTIAL:
        return f"partial: {len(tier_entry.get('missing') or [])} expected check(s) did not run{beside}"
    if verdict in FAILING:
        harness = expected.unexplained_failures(tier_entry)
        if harness:  # NOT_PROVEN with unexplained failures: the harness's alone
            msg = next((c["failure"].get("message") for c in harness if isinstance(c.get("failure"), dict)), None)
            return f"harness error: {msg or tier_entry.get('reason') or verdict}{beside}"
        return f"{tier} tier {verdict} before any check could say: {tier_entry.get('reason') or 'no reason given'}"
    reason = re.sub(rf"^{tier} tier:\s*", "", tier_entry.get("reason") or "did not run")
    return f"{tier} tier {verdict or 'missing'}: {reason}"


def _install_failed(record: dict, version: str, seconds: float, path: str | None) -> Probe | None:
    install = record.get("install") or {}
    if install.get("verdict") != "failed":
        return None
    msg = (install.get("failure") or {}).get("message", "install failed")
    return Probe(version, UNTESTABLE, f"does not install: {msg}", install.get("failure"), seconds, path)


def _did_not_run(t: dict, tier: str, version: str, seconds: float, path: str | None) -> Probe:
    why = not_proven_why(t, tier)
    # A tier skipped for want of a GPU skips for every release: the machine, not the release, is the problem.
    return Probe(
        version,
        UNTESTABLE,
        why,
        None,
        seconds,
        path,
        fatal=t.get("verdict") not in FAILING and "CUDA GPU" in (t.get("reason") or ""),
        known_upstream=known_ids(t),
    )


def classify_record(
    record: dict,
    tier: str,
    version: str,
    seconds: float,
    path: str | None = None,
    *,
    breaking: frozenset[str] | None = None,
    issues=None,
) -> Probe:
    """good / bad / untestable / known-only from a probe's row record (module docstring). ``breaking``: the checks
    that fail at the bad end (``failing_checks`` of the row's failing run, or of the canary); ``issues``: the
    known-upstream list (default known_upstream.json)."""
    if (p := _install_failed(record, version, seconds, path)) is not None:
        return p
    t = _tier(record, tier, issues)
    state = expected.tier_state(t)
    owned = _owned_failures(t)
    ids = known_ids(t)
    passed = {short_check_id(c["id"]) for c in t.get("checks") or [] if c.get("outcome") == "passed"}
    unseen = sorted((breaking or frozenset()) - passed)
    kw = dict(seconds=seconds, record=path, breaks=sorted(short_check_id(c["id"]) for c in owned), known_upstream=ids)
    if state == expected.BROKEN:
        kinds = sorted({(c.get("failure") or {}).get("kind") for c in owned} - {None})
        first = next((c["failure"] for c in owned if c.get("failure")), None)
        detail = f"{len(owned)} check(s) {t.get('verdict')}" + (f" [{', '.join(kinds)}]" if kinds else "")
        detail += f": {first.get('message')}" if first else ""
        return Probe(version, BAD, detail, first or {"kind": None, "message": t.get("reason")}, **kw)
    if state == expected.PROVEN:
        if unseen:  # the tier held, but without running a check that breaks at the bad end: nothing shown
            return Probe(
                version,
                UNTESTABLE,
                f"{tier} tier passed without the check(s) that break: {', '.join(unseen[:3])}",
                **kw,
            )
        return Probe(version, GOOD, **kw)
    if state == expected.KNOWN_ONLY:
        if breaking and not unseen:  # the break searched is absent; only listed bugs failed
            return Probe(version, GOOD, f"known upstream only ({', '.join(ids)}); the check(s) that break passed", **kw)
        why = (
            f"the check(s) that break did not pass here: {', '.join(unseen[:3])}"
            if breaking
            else "which checks break is not known"
        )
        return Probe(
            version, KNOWN_ONLY, f"{tier} tier fails only on listed upstream issues ({', '.join(ids)}); {why}", **kw
        )
    if t.get("verdict") == PARTIAL:  # nothing failed; a bisect asks whether the tier breaks, not whether it qualifies
        n = len(t.get("missing") or [])
        if breaking and not unseen:
            return Probe(version, GOOD, f"partial: {n} expected check(s) did not run, none that breaks", **kw)
        why = (
            f"the check(s) that break did not run here: {', '.join(unseen[:3])}"
            if breaking
            else "which checks break is not known"
        )
        return Probe(version, UNTESTABLE, f"partial: {n} expected check(s) did not run; {why}", **kw)
    return _did_not_run(t, tier, version, seconds, path)


def classify_for_known(
    record: dict, tier: str, version: str, seconds: float, path: str | None, issue, *, issues=None
) -> Probe:
    """Where a known-upstream entry (``issue``) began: bad where a check shows its signature (its checks, kind,
    match, metrics and passed_beside; its affected range aside, since the search is for where the range starts),
    good where none does and one of its checks ran and passed, untestable otherwise (another failure breaks the
    tier, or none of its checks passed here)."""
    if (p := _install_failed(record, version, seconds, path)) is not None:
        return p
    t = _tier(record, tier, issues)
    checks = t.get("checks") or []
    kw = dict(
        seconds=seconds,
        record=path,
        known_upstream=known_ids(t),
        breaks=sorted(short_check_id(c["id"]) for c in _owned_failures(t)),
    )
    hits = [c for c in checks if issue.matches(c, checks)]
    if hits:
        first = next((c["failure"] for c in hits if c.get("failure")), None)
        return Probe(version, BAD, f"{len(hits)} check(s) show {issue.id}: {(first or {}).get('message')}", first, **kw)
    owned = _owned_failures(t)
    if expected.tier_state(t) == expected.BROKEN:
        first = next((c["failure"] for c in owned if c.get("failure")), {})
        return Probe(
            version,
            UNTESTABLE,
            f"fails otherwise, not with {issue.id}'s signature: {first.get('message') or t.get('reason')}",
            **kw,
        )
    shown = sorted(
        short_check_id(c["id"])
        for c in checks
        if c.get("outcome") == "passed" and short_check_id(c["id"]).split("[", 1)[0] in issue.checks
    )
    if shown:
        return Probe(version, GOOD, f"{issue.id} absent: {', '.join(shown[:2])} passed", **kw)
    if any(c.get("outcome") in ("passed", *FAILING) for c in checks):
        return Probe(version, UNTESTABLE, f"none of {issue.id}'s checks ran and passed here", **kw)
    return _did_not_run(t, tier, version, seconds, path)
