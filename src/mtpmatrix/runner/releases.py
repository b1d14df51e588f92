"""Releases on the index that the rows do not pin yet.

    python -m mtpmatrix releases [--json] [--results DIR]

For sglang, transformers and torch: the releases on the index newer than every row's pin (pinned rows, default or
not), and whether a canary has run each of them (any ``results/*/*/row.json`` carrying a ``canary`` record whose
installed version is that release), with its verdict. The report stays offline: its canary section lists only the
releases the run's own canaries installed (report/canaries.py).

``newest`` is the one place a floating range becomes a release (canary rows use it): the newest release on the
index inside the range, or one line naming the range and the newest releases seen.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.paths import CONSTRAINTS_DIR
from mtpmatrix.core.rows import REQUIRED_PINS
from mtpmatrix.core.store import row_files
from mtpmatrix.runner import index

WATCHED = REQUIRED_PINS  # every row pins them: their newest pin is the line a release must be past
Fetch = Callable[[str], list[Version]]


class ReleaseError(RuntimeError):
    """No release fits, or the index cannot be asked; the message is one line."""


def fetch_releases(name: str, fetch: Fetch | None = None) -> list[Version]:
    """Sorted final releases of ``name`` (``fetch`` replaces the index in tests)."""
    try:
        return sorted(Version(str(v)) for v in (fetch or index.releases)(name))
    except index.IndexError_ as exc:
        raise ReleaseError(str(exc)) from None


def newest(name: str, spec: SpecifierSet | str, *, fetch: Fetch | None = None) -> Version:
    """The newest release of ``name`` inside ``spec``; ReleaseError naming the range and the newest seen."""
    spec = SpecifierSet(str(spec))
    rels = fetch_releases(name, fetch)
    inside = [v for v in rels if spec.contains(v, prereleases=bool(spec.prereleases))]
    if not inside:
        seen = ", ".join(str(v) for v in reversed(rels[-3:])) or "none"
        raise ReleaseError(f"no release of {name} satisfies {name}{spec or ' (any)'} (newest on the index: {seen})")
    return inside[-1]


def newest_pins(rows) -> dict[str, Version]:
    """The newest pin of each watched package over ``rows``."""
    return {pkg: max(Version(r.pins[pkg]) for r in rows) for pkg in WATCHED}


def canary_runs(results: Path) -> dict[str, dict[str, list[dict]]]:
    """{package: {version: [{row, run, verdict}]}} of every canary row recorded under ``results``."""
    out: dict[str, dict[str, list[dict]]] = {}
    results = Path(results)
    if not results.is_dir():
        return out
    runs = sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith("."))  # hidden: no run
    for f in (f for run in runs for f in row_files(run)):
        try:
            rec = read_json(f)
        except (OSError, ValueError):
            continue
        if not rec.get("canary") or rec.get("verdict") in (None, "pending"):
            continue
        for pkg, ver in (rec.get("versions") or {}).items():
            pkg = canonicalize_name(pkg)
            if pkg in WATCHED:
                out.setdefault(pkg, {}).setdefault(str(ver), []).append(
                    {"row": f.parent.name, "run": f.parent.parent.name, "verdict": rec["verdict"]}
                )
    return out


def untested(rows, results: Path, *, fetch: Fetch | None = None) -> list[dict]:
    """Per watched package: the newest pin and each newer release on the index with the canaries that ran it."""
    pins = newest_pins(rows)
    ran = canary_runs(results)
    out = []
    for pkg in WATCHED:
        newer = [v for v in fetch_releases(pkg, fetch) if v > pins[pkg]]
        out.append(
            {
                "package": pkg,
                "newest_pin": str(pins[pkg]),
                "newer": [{"version": str(v), "canaries": ran.get(pkg, {}).get(str(v), [])} for v in newer],
            }
        )
    return out


def lines(table: list[dict]) -> list[str]:
    out = []
    for entry in table:
        if not entry["newer"]:
            out.append(f"{entry['package']}: nothing newer than the rows' pin {entry['newest_pin']}")
            continue
        parts = []
        for n in entry["newer"]:
            runs = n["canaries"]
            if runs:
                shown = "; ".join(f"{r['row']} {r['verdict']} (run {r['run']})" for r in runs[-3:])
                parts.append(
                    f"{n['version']} (canaries: {shown}" + (f"; +{len(runs) - 3} more" if len(runs) > 3 else "") + ")"
                )
            else:
                parts.append(f"{n['version']} (no canary has run it)")
        out.append(f"{entry['package']}: newer than the rows' pin {entry['newest_pin']}: " + ", ".join(parts))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable")


def run(ns: argparse.Namespace, *, fetch: Fetch | None = None, rows=None) -> int:
    from mtpmatrix.core.rows import RowError, load_rows

    try:
        rows = rows if rows is not None else load_rows(CONSTRAINTS_DIR)
        table = untested(rows, ns.results, fetch=fetch)
    except (RowError, ReleaseError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(table, indent=2) if ns.json else "\n".join(lines(table)))
    return 0
