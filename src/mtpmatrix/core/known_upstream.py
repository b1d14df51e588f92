"""Known upstream issues: failures that are not this project's and not a regression of the release under test -- a
library's bug, or a known sglang deviation from the transformers reference -- which the matrix keeps visible but
apart.

The entries live in ``known_upstream.json`` next to this module, one object each::

    {"id": "...", "package": "transformers", "affected": ">=5.18.0,<5.20.0", "tier": "reference",
     "component": "library", "kind": "crash", "checks": ["test_function", ...],
     "match": "regex on 'TYPE: MESSAGE (raised at FILE:LINE in FUNC)'",
     "signature": {"metrics": {"name": {"min": 1, "max": 2}}, "passed_beside": ["test_x[case]", ...],
                   "problems": "regex", "equals": {"output_ids": [...]}},
     "summary": "one line", "upstream": "https://...", "fixed_in": "5.20.0", "serving_path": false,
     "shows_when": "a condition the run does not control (optional)"}

A failed or errored check matches an entry only by the entry's signature of the bug: the check is one of ``checks``
(test functions), its failure has the entry's ``kind``, its failure text matches ``match``, each metric named in
``signature.metrics`` is recorded on the check and inside its bounds, and each check named in
``signature.passed_beside`` ran and passed in the same tier (what rules out a broader break that happens to print
the same words); a metric that is not a finite number (NaN, an infinity) never matches. Where a check counts its
problems in one line ("N problem(s) over ...") and records them (metric ``problems``), ``signature.problems`` holds
every one: all N recorded, each fullmatching it (a second bug beside the known one is never excused by it); and
``signature.equals`` holds a recorded metric to a value exactly, type included (an output measured whole, where the
message names only its first difference). ``component`` says whose
bug it is: ``library`` (transformers: not sglang) or ``sglang`` (a deviation on sglang's own serving path); the
report's headline keeps the two apart.

Every entry is bounded: its ``affected`` range ends -- at the release that fixed it (``<5.20.0``), or, for an open
bug, at the newest release it was seen on (``<=5.24.0``, said in its summary) -- or its signature bounds every metric
below and above. ``load`` refuses an entry with neither (one line naming the file and the entry): an entry must not
explain failures of releases nobody has looked at, nor every value on one side of a bound (a new regression that
overshoots the bug's measured effect would match it too). Metric bounds are finite numbers, min <= max.

Matching is re-derived every time: ``apply`` strips whatever tags and known-upstream verdicts a record carries
(written by an earlier run, a GPU box, an older list) and tags again from the current list, so an entry removed or
narrowed later changes old runs' verdicts too. A tier whose every failure is so tagged gets the verdict
``known-upstream``, which does not fail the row (store.row_verdict). Strict: a check named in ``checks`` that passes
while the package is in the affected range means the entry no longer describes this environment; it is listed as
stale ("can go"), so entries do not outlive their bugs.

Unless the bug shows only under a condition the run does not control: ``shows_when`` (optional, a non-empty string)
names it -- "a token_ids_logprob request decodes in one batch step with a request that did not ask (arrival timing
decides)". Such a bug is in the code path of every server its checks run on, and a run shows it only when the server
happens to meet the condition (which requests share a batch step depends on when they arrive). A listed check of such
an entry that passes in range is then not evidence of a fix: it is listed apart, as "did not show"
(``unshown_known_upstream``, with the condition), never as stale. A pass is a pass either way: the tier's verdict and
the matching of failures are the same with and without ``shows_when``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from mtpmatrix.core.kinds import KINDS
from mtpmatrix.core.record_types import CheckRecord, Tiers
from mtpmatrix.core.schema import FAILING, KNOWN_UPSTREAM, TIERS, short_check_id, worst

FILE = Path(__file__).with_name("known_upstream.json")
_FIELDS = (
    "id",
    "package",
    "affected",
    "tier",
    "component",
    "kind",
    "match",
    "checks",
    "signature",
    "summary",
    "upstream",
    "fixed_in",
    "serving_path",
    "shows_when",
)
_REQUIRED = ("id", "package", "affected", "tier", "component", "kind", "match", "checks", "summary", "upstream")
COMPONENTS = ("library", "sglang")  # whose bug: a library's (not sglang), or sglang's own serving path
_SIGNATURE_FIELDS = ("metrics", "passed_beside", "problems", "equals")
# A check that sums its problems in one failure line ("N problem(s) over ...; first: ...") and records them in the
# metric "problems": an entry with a "problems" regex matches it only when all N are recorded and each one fullmatches.
_PROBLEM_COUNT = re.compile(r"(\d+) problem\(s\) over ")
# Tier-level keys apply() derives; whatever a record already holds under them is stripped first.
DERIVED_KEYS: tuple[Literal["known_upstream"], Literal["stale_known_upstream"], Literal["unshown_known_upstream"]] = (
    "known_upstream",
    "stale_known_upstream",
    "unshown_known_upstream",  # entries with shows_when whose listed checks passed in range: did not show, not stale
)


@dataclass(frozen=True)
class KnownIssue:
    id: str
    package: str
    affected: str  # a PEP 440 specifier set, e.g. ">=5.18.0,<5.20.0"
    tier: str
    component: str  # COMPONENTS: 'library' (not sglang) or 'sglang' (on its serving path)
    kind: str  # the failure kind the bug produces (kinds.KINDS)
    match: str  # regex searched in the failure text
    checks: tuple[str, ...]  # test functions (or cases, test_x[case]) known to hit it; one passing in range: it can
    #                          go, unless shows_when is set (then it did not show)
    summary: str
    upstream: str
    fixed_in: str | None = None
    serving_path: bool = False  # whether sglang's serving path runs the code in question (the sglang entries: yes)
    signature: dict[str, Any] | None = None  # {"metrics": {name: {"min"/"max": x}}, "passed_beside": [short check ids],
    #                                            "problems": regex each of the check's recorded problems fullmatches,
    #                                            "equals": {name: the value a recorded metric must equal exactly}}
    shows_when: str | None = None  # the condition, outside the run's control, under which alone the bug shows

    def applies_to(self, versions: Mapping[str, str | None]) -> bool:
        v = versions.get(self.package)
        if not v:
            return False
        try:
            return Version(v) in SpecifierSet(self.affected)
        except InvalidVersion:
            return False

    def matches(self, check: CheckRecord, tier_checks: Sequence[CheckRecord] = ()) -> bool:
        """Whether ``check`` failed with this bug's signature; ``tier_checks`` are the other checks of its tier."""
        f = check.get("failure")
        if check.get("outcome") not in FAILING or not self.lists(check["id"]):
            return False
        if f is None or f.get("kind") != self.kind:
            return False
        # where it was raised counts too: a generic message is only this bug when it comes from the broken code
        text = failure_text(f)
        if re.search(self.match, text) is None:
            return False
        sig = self.signature or {}
        metrics = check.get("metrics") or {}
        for name, bounds in (sig.get("metrics") or {}).items():
            v = metrics.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                # not recorded, or NaN / an infinity (NaN compares false with every bound, an infinity passes a
                # one-sided one): the record cannot show this bug
                return False
            if ("min" in bounds and v < bounds["min"]) or ("max" in bounds and v > bounds["max"]):
                return False
        if "problems" in sig and not _every_problem(sig["problems"], f.get("message") or "", metrics.get("problems")):
            return False
        if any(not _same(metrics.get(name, _UNSET), want) for name, want in (sig.get("equals") or {}).items()):
            return False  # an output the bug is measured to give, whole (a message names only its first difference)
        outcome = {short_check_id(c["id"]): c.get("outcome") for c in tier_checks}
        return all(outcome.get(name) == "passed" for name in sig.get("passed_beside") or ())

    def lists(self, check_id: str) -> bool:
        """Whether ``checks`` names this check: by its function (every case of it) or, for a bug that only some
        cases of a parametrised check can show (an MTP server beside its no-MTP reference), by its case."""
        return _function(check_id) in self.checks or short_check_id(check_id) in self.checks

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


_UNSET = object()


def _same(got: Any, want: Any) -> bool:
    """Equal as JSON values are, type included (True is not 1, 1.0 is not 1)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, list):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return bool(got == want)


def _every_problem(pattern: str, message: str, recorded: Any) -> bool:
    """Whether the failure's problems are all recorded (as many as its line counts) and each one is this bug's: a
    check with one known problem and another of a second bug is not excused by the first's entry."""
    count = _PROBLEM_COUNT.search(message)
    if count is None or not isinstance(recorded, list) or len(recorded) != int(count.group(1)):
        return False
    return all(isinstance(p, str) and re.fullmatch(pattern, p) is not None for p in recorded)


def failure_text(f: Mapping[str, Any]) -> str:
    """What an entry's ``match`` is searched in: 'TYPE: MESSAGE (raised at FILE:LINE in FUNC)'."""
    return f"{f.get('type') or ''}: {f.get('message') or ''} (raised at {f.get('raised_at') or '?'})"


# The text of a failure with no type, message or frame: what every failure's text holds. A match found in it (``.*``,
# ``raised at``, ``:``) matches every failure of the entry's checks, a new regression's too.
_BARE_FAILURE_TEXT = failure_text({})


def load(path: Path | None = None) -> list[KnownIssue]:
    """The entries of ``path`` (default: FILE); ValueError with one line (file and entry) for a malformed one."""
    path = FILE if path is None else path
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    out = []
    for i, e in enumerate(raw.get("issues", []) if isinstance(raw, dict) else []):
        where = f"{path}: issue {i} ({e.get('id', '?') if isinstance(e, dict) else '?'})"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: not an object")
        unknown = sorted(set(e) - set(_FIELDS))
        missing = [k for k in _REQUIRED if not e.get(k)]
        if unknown or missing:
            raise ValueError(
                f"{where}: "
                + "; ".join(
                    ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
                    + ([f"missing {', '.join(missing)}"] if missing else [])
                )
            )
        if e["tier"] not in TIERS:
            raise ValueError(f"{where}: unknown tier {e['tier']!r}; known: {', '.join(TIERS)}")
        if e["component"] not in COMPONENTS:
            raise ValueError(f"{where}: unknown component {e['component']!r}; known: {', '.join(COMPONENTS)}")
        if e["kind"] not in KINDS:
            raise ValueError(f"{where}: unknown kind {e['kind']!r}; known: {', '.join(KINDS)}")
        if "shows_when" in e and (not isinstance(e["shows_when"], str) or not e["shows_when"].strip()):
            raise ValueError(
                f"{where}: shows_when {e['shows_when']!r} is not a non-empty string (the condition the bug shows under)"
            )
        sig = e.get("signature") or {}
        bad_sig = sorted(set(sig) - set(_SIGNATURE_FIELDS)) if isinstance(sig, dict) else ["(not an object)"]
        if bad_sig or any(
            not isinstance(b, dict) or set(b) - {"min", "max"} for b in (sig.get("metrics") or {}).values()
        ):
            raise ValueError(
                f"{where}: signature: unknown field(s) {', '.join(bad_sig) or 'in a metric bound'}; "
                f"known: {', '.join(_SIGNATURE_FIELDS)} with min/max bounds"
            )
        for name, b in (sig.get("metrics") or {}).items():
            for side in ("min", "max"):
                v = b.get(side)
                if side in b and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                    raise ValueError(f"{where}: signature metric {name}: {side} {v!r} is not a finite number")
            if "min" in b and "max" in b and b["min"] > b["max"]:
                raise ValueError(f"{where}: signature metric {name}: min {b['min']} above max {b['max']}")
        if not isinstance(sig.get("equals") or {}, dict):
            raise ValueError(f"{where}: signature equals {sig['equals']!r} is not an object of recorded metrics")
        if "problems" in sig and not isinstance(sig["problems"], str):
            raise ValueError(f"{where}: signature problems {sig['problems']!r} is not a regex string")
        try:
            affected = SpecifierSet(e["affected"])
            re.compile(e["match"])
            re.compile(sig.get("problems") or "")
        except (InvalidSpecifier, re.error) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if re.search(e["match"], _BARE_FAILURE_TEXT) is not None:
            raise ValueError(
                f"{where}: match {e['match']!r} matches a failure with no words ({_BARE_FAILURE_TEXT!r}), so any "
                "failure of its checks: name the bug's own words"
            )
        if not _bounded_above(affected) and not _two_sided(sig):
            raise ValueError(
                f"{where}: unbounded: affected {e['affected']!r} has no upper bound and the signature "
                f"does not bound every metric on both sides (end the range at the fix, or at the newest "
                f"release it was seen on with '<=')"
            )
        out.append(KnownIssue(**{**e, "checks": tuple(e["checks"])}))
    ids = [k.id for k in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids")
    return out


def _bounded_above(spec: SpecifierSet) -> bool:
    """Whether some release ends the range (``<``, ``<=``, ``==``, ``===``, ``~=``; ``!=`` only drops one)."""
    return any(s.operator in ("<", "<=", "==", "===", "~=") for s in spec)


def _two_sided(signature: dict[str, Any]) -> bool:
    """Whether the signature names at least one metric and bounds every one of them below and above."""
    metrics = signature.get("metrics") or {}
    return bool(metrics) and all("min" in b and "max" in b for b in metrics.values())


def _function(check_id: str) -> str:
    """``tests/tiers/test_reference.py::test_x[e-series]`` -> ``test_x``."""
    return short_check_id(check_id).split("[", 1)[0]


def strip(tiers: Tiers) -> Tiers:
    """Drop every stored known-upstream tag, list and verdict of ``tiers`` (in place): what apply() derives again.
    A tier whose stored verdict was known-upstream goes back to the worst of its failures."""
    for tier in tiers.values():
        for key in DERIVED_KEYS:
            tier.pop(key, None)
        for chk in tier.get("checks") or []:
            chk.pop("known_upstream", None)
        if tier.get("verdict") == KNOWN_UPSTREAM:
            tier["verdict"] = worst(c.get("outcome") for c in tier.get("checks") or [] if c.get("outcome") in FAILING)
    return tiers


def apply(tiers: Tiers, versions: Mapping[str, str | None], issues: list[KnownIssue] | None = None) -> Tiers:
    """Tag the failures of ``tiers`` (tiers.json's ``tiers``) that match a known issue; mark stale entries, and those
    with ``shows_when`` whose listed checks passed as not shown.

    Strips what a record already carries first (``strip``), so the result depends only on the checks and the current
    list. Changes ``tiers`` in place and returns it; idempotent.
    """
    issues = load() if issues is None else issues
    strip(tiers)
    for issue in issues:
        if not issue.applies_to(versions):
            continue
        tier = tiers.get(issue.tier)
        if not tier:
            continue
        checks = tier.get("checks") or []
        hit, passed = [], []
        for chk in checks:
            if issue.matches(chk, checks):
                chk["known_upstream"] = issue.id
                hit.append(chk["id"])
            elif chk.get("outcome") == "passed" and issue.lists(chk["id"]):
                passed.append(chk["id"])
        entry: dict[str, Any] = {
            "id": issue.id,
            "package": issue.package,
            "version": versions.get(issue.package),
            "component": issue.component,
            "summary": issue.summary,
            "upstream": issue.upstream,
            "fixed_in": issue.fixed_in,
            "serving_path": issue.serving_path,
        }
        if issue.shows_when:  # only then: an entry without it is recorded as it always was
            entry["shows_when"] = issue.shows_when
        if hit:
            tier["known_upstream"] = tier.get("known_upstream", []) + [dict(entry, checks=hit)]
        # a pass of a bug that shows only under shows_when's condition says it did not show, not that it is gone
        key: Literal["stale_known_upstream", "unshown_known_upstream"] = (
            "unshown_known_upstream" if issue.shows_when else "stale_known_upstream"
        )
        if passed:
            tier[key] = tier.get(key, []) + [dict(entry, checks=passed)]
    for tier in tiers.values():
        bad = [c for c in tier.get("checks") or [] if c.get("outcome") in FAILING]
        # a session that stopped early ('incomplete', pytest_plugin.mark_incomplete) proves nothing either way
        if (
            tier.get("verdict") in FAILING
            and not tier.get("incomplete")
            and bad
            and all(c.get("known_upstream") for c in bad)
        ):
            tier["verdict"] = KNOWN_UPSTREAM
    return tiers
