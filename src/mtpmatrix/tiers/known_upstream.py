"""Known upstream issues: failures that are not this project's and not a regression of the release under test -- a
library's bug, or a known sglang deviation from the transformers reference -- which the matrix keeps visible but
apart.

The entries live in ``known_upstream.json`` next to this module, one object each::

    {"id": "...", "package": "transformers", "affected": ">=5.18.0,<5.20.0", "tier": "reference",
     "match": "regex on 'TYPE: MESSAGE (raised at FILE:LINE in FUNC)'", "checks": ["test_function", ...],
     "summary": "one line", "upstream": "https://...", "fixed_in": "5.20.0", "serving_path": false}

A failed or errored check of ``tier`` whose failure message matches ``match`` while the installed ``package`` is in
``affected`` is tagged with the entry's id; a tier whose every failure is so tagged gets the verdict
``known-upstream``, which does not fail the row (store.row_verdict). Strict: a check named in ``checks`` that passes
while the package is in the affected range means the entry no longer describes this environment; it is listed as
stale ("can go"), so entries do not outlive their bugs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from mtpmatrix.schema import FAILING, KNOWN_UPSTREAM, TIERS

FILE = Path(__file__).with_name("known_upstream.json")
_FIELDS = ("id", "package", "affected", "tier", "match", "checks", "summary", "upstream", "fixed_in",
           "serving_path")


@dataclass(frozen=True)
class KnownIssue:
    id: str
    package: str
    affected: str  # a PEP 440 specifier set, e.g. ">=5.18.0,<5.20.0"
    tier: str
    match: str  # regex searched in the failure message
    checks: tuple[str, ...]  # test functions known to hit it (a passing one in range: the entry can go)
    summary: str
    upstream: str
    fixed_in: str | None = None
    serving_path: bool = False  # whether sglang's serving path runs the code in question (the sglang entries: yes)

    def applies_to(self, versions: dict) -> bool:
        v = versions.get(self.package)
        if not v:
            return False
        try:
            return Version(v) in SpecifierSet(self.affected)
        except InvalidVersion:
            return False

    def matches(self, check: dict) -> bool:
        f = check.get("failure") or {}
        # where it was raised counts too: a generic message is only this bug when it comes from the broken code
        text = f"{f.get('type') or ''}: {f.get('message') or ''} (raised at {f.get('raised_at') or '?'})"
        return check.get("outcome") in FAILING and re.search(self.match, text) is not None

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def load(path: Path = FILE) -> list[KnownIssue]:
    """The entries of ``path``; ValueError with one line (file and entry) for a malformed one."""
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
        missing = [k for k in ("id", "package", "affected", "tier", "match", "checks", "summary", "upstream")
                   if not e.get(k)]
        if unknown or missing:
            raise ValueError(f"{where}: " + "; ".join(
                ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
                + ([f"missing {', '.join(missing)}"] if missing else [])))
        if e["tier"] not in TIERS:
            raise ValueError(f"{where}: unknown tier {e['tier']!r}; known: {', '.join(TIERS)}")
        try:
            SpecifierSet(e["affected"])
            re.compile(e["match"])
        except (InvalidSpecifier, re.error) as exc:
            raise ValueError(f"{where}: {exc}") from None
        out.append(KnownIssue(**{**e, "checks": tuple(e["checks"])}))
    ids = [k.id for k in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids")
    return out


def _function(check_id: str) -> str:
    """``tests/tiers/test_reference.py::test_x[e-series]`` -> ``test_x``."""
    return check_id.split("::", 1)[-1].split("[", 1)[0]


def apply(tiers: dict, versions: dict, issues: list[KnownIssue] | None = None) -> dict:
    """Tag the failures of ``tiers`` (tiers.json's ``tiers``) that match a known issue; mark stale entries.

    Changes ``tiers`` in place and returns it. Idempotent, so imported results can go through it again.
    """
    issues = load() if issues is None else issues
    for issue in issues:
        if not issue.applies_to(versions):
            continue
        tier = tiers.get(issue.tier)
        if not tier:
            continue
        hit, stale = [], []
        for chk in tier.get("checks") or []:
            if issue.matches(chk):
                chk["known_upstream"] = issue.id
                hit.append(chk["id"])
            elif chk.get("outcome") == "passed" and _function(chk["id"]) in issue.checks:
                stale.append(chk["id"])
        entry = {"id": issue.id, "package": issue.package, "version": versions.get(issue.package),
                 "summary": issue.summary, "upstream": issue.upstream, "fixed_in": issue.fixed_in,
                 "serving_path": issue.serving_path}
        if hit:
            known = [e for e in tier.get("known_upstream", []) if e["id"] != issue.id]
            tier["known_upstream"] = known + [dict(entry, checks=hit)]
        if stale:
            old = [e for e in tier.get("stale_known_upstream", []) if e["id"] != issue.id]
            tier["stale_known_upstream"] = old + [dict(entry, checks=stale)]
    for tier in tiers.values():
        bad = [c for c in tier.get("checks") or [] if c.get("outcome") in FAILING]
        # a session that stopped early ('incomplete', pytest_plugin.mark_incomplete) proves nothing either way
        if (tier.get("verdict") in FAILING and not tier.get("incomplete") and bad
                and all(c.get("known_upstream") for c in bad)):
            tier["verdict"] = KNOWN_UPSTREAM
    return tiers
