"""The versions a row ran, judged: the installed sglang, transformers, torch (and every other pin recorded) are the
row's pins with exact ``--with`` overrides applied, or inside a ``--with`` range; a wheel or checkout candidate's
sglang is the candidate's version."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mtpmatrix.core.record_types import Problem, RowRecord, problem

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

MAIN_PACKAGES = ("sglang", "transformers", "torch")


def base_version(version: str | None) -> str | None:
    """``version`` without its local part (``2.11.0+cu130`` -> ``2.11.0``); None when it is no string."""
    return version.split("+", 1)[0] if isinstance(version, str) else None


def split_overrides(record: RowRecord) -> tuple[dict[str, str], dict[str, SpecifierSet]]:
    """A record's ``--with`` overrides as ({package: the one release it names}, {package: SpecifierSet of a range}),
    canonical names; a spec that does not parse is neither."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    exact: dict[str, str] = {}
    ranges: dict[str, SpecifierSet] = {}
    for spec in record.get("overrides") or []:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        named = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if len(named) == 1 and len(req.specifier) == 1:
            exact[name] = named[0]
        else:
            ranges[name] = req.specifier
    return exact, ranges


def pins_with_overrides(record: RowRecord) -> dict[str, str]:
    """The row's pins (canonical names) with every exact ``--with`` override applied."""
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {canonicalize_name(k): v for k, v in ((record.get("row") or {}).get("pins") or {}).items()}
    return {**pins, **split_overrides(record)[0]}


def expected_versions(record: RowRecord) -> dict[str, str]:
    """What the row must have installed: ``pins_with_overrides`` less the packages a ``--with`` range frees (judged
    against the range by ``judge``). A wheel or checkout candidate's sglang is the candidate's version, not the
    pin (every other pin still holds)."""
    ranges = split_overrides(record)[1]
    pins = {k: v for k, v in pins_with_overrides(record).items() if k not in ranges}
    recorded = record.get("candidate")
    cand: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    if cand.get("kind") in ("wheel", "checkout"):
        pins["sglang"] = cand.get("version") or "(none recorded)"
    return pins


def judge(record: RowRecord, ran: bool) -> list[Problem]:
    """Every problem with the versions ``record`` ran (``ran``: its tiers ran checks)."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    want = expected_versions(record)
    got: dict[str, str | None] = {canonicalize_name(k): v for k, v in (record.get("versions") or {}).items()}
    out = []
    if ran:
        for name in MAIN_PACKAGES:
            if name in want and not got.get(name):
                out.append(problem(None, f"the record does not say which {name} ran"))
    for name, version in sorted(want.items()):
        have = got.get(name)
        if have and base_version(have) != base_version(version):
            cand = (record.get("candidate") or {}) if name == "sglang" else {}
            out.append(
                problem(
                    None,
                    f"{name} {have} ran, the candidate is {version}"
                    if cand.get("kind") in ("wheel", "checkout")
                    else f"{name} {have} ran, the row pins {version}",
                )
            )
    for name, spec in sorted(split_overrides(record)[1].items()):
        have = got.get(name)
        try:
            inside = have is not None and spec.contains(Version(str(base_version(have))), prereleases=True)
        except InvalidVersion:
            inside = False
        if have and not inside:
            out.append(problem(None, f"{name} {have} ran, outside the override {name}{spec}"))
    return out
