"""A run's manifest, ``results/<run-id>/manifest.json``: what the run planned, fixed when its first row starts.

    {"schema": 1, "run_id", "created", "fingerprint": evidence.fingerprint.describe(),
     "invocation": {"argv", "tiers", "overrides", "server_urls", "pytest_args", "knobs"},
     "rows": {row id: {"pins", "python", "torch_backend", "constraints_sha256", ["candidate"]}},
     "not_run": {row id: why}, "resumed": [{"at", "argv"}]}

The report judges every record against it (evidence.judge): a planned row without a record is "not run" (with the
reason its session gave, ``not_run``), a record the plan does not name, or one whose pins, overrides, knobs or suite
differ from the plan's, proves nothing for this run. Resuming a run adds rows to the plan but never rewrites a row
already planned: a row whose constraints changed since is run again (``changed_rows``), not kept with its old pins.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.record_types import Fingerprint, Invocation, Manifest, PlannedRow, RowInfo

FILE = "manifest.json"
SCHEMA = 1


class ManifestError(ValueError):
    """A manifest that cannot be read or does not fit the run; one line."""


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def candidate_identity(candidate: object) -> dict[str, Any] | None:
    """What names a candidate (row.json's ``candidate``, runner/candidate.py): its kind, the sha256 of its patch,
    wheel or uncommitted change, a checkout's commit and dirtiness. None for a record without one."""
    if not isinstance(candidate, dict):
        return None
    return {k: candidate.get(k) for k in ("kind", "sha256", "commit", "dirty")}


def planned_row(
    row_dict: RowInfo,
    constraints_text: str | None = None,
    overrides: list[str] | None = None,
    candidate: dict[str, Any] | None = None,
) -> PlannedRow:
    """What the plan fixes of a row (``Row.as_dict()``): its pins, Python, torch build and the constraints file's
    checksum; ``overrides`` where the row has its own (a canary's), else the invocation's apply; a candidate row's
    ``candidate`` (``candidate_identity``)."""
    out: PlannedRow = {
        "pins": dict(row_dict.get("pins") or {}),
        "python": row_dict.get("python"),
        "torch_backend": row_dict.get("torch_backend"),
    }
    if overrides is not None:
        out["overrides"] = list(overrides)
    if candidate is not None:
        out["candidate"] = dict(candidate)
    if constraints_text is not None:
        out["constraints_sha256"] = hashlib.sha256(constraints_text.encode()).hexdigest()
    return out


def path(run_dir: Path) -> Path:
    return Path(run_dir) / FILE


def _read_file(f: Path) -> Manifest | None:
    if not f.is_file():
        return None
    try:
        data = read_json(f)
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, bad UTF-8
        raise ManifestError(f"{f}: unreadable ({exc})") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("rows"), dict)
        or not all(isinstance(v, dict) for v in data["rows"].values())
    ):
        raise ManifestError(f"{f}: not a run manifest (no 'rows' object)")
    return cast(Manifest, data)  # its shape, as far as the readers count on it: checked just above


def read(run_dir: Path) -> Manifest | None:
    """The run's plan: ``manifest.json`` merged with every ``manifest-<name>.json`` beside it (a pipeline that runs
    each row as its own job plans the run once, ``python -m mtpmatrix plan``, and each job's own manifest is renamed
    so the merged folder keeps them all); None when the run has none; ManifestError when one is unreadable. Plans
    that disagree -- another suite, other pins for a row -- are listed under ``conflicts``."""
    files = sorted(Path(run_dir).glob("manifest-*.json"))
    plans = [(f, d) for f in [path(run_dir), *files] if (d := _read_file(f)) is not None]
    if not plans:
        return None
    merged: Manifest = {
        **plans[0][1],
        "rows": dict(plans[0][1]["rows"]),
        "not_run": dict(plans[0][1].get("not_run") or {}),
        "conflicts": [],
    }
    suite = (merged.get("fingerprint") or {}).get("suite")
    for f, d in plans[1:]:
        if (d.get("fingerprint") or {}).get("suite") != suite:
            merged["conflicts"].append(
                f"{f.name} plans suite {str((d.get('fingerprint') or {}).get('suite'))[:12]}, "
                f"{plans[0][0].name} suite {str(suite)[:12]}"
            )
        for rid, r in d["rows"].items():
            was = merged["rows"].setdefault(rid, r)
            if was.get("pins") != r.get("pins"):
                merged["conflicts"].append(f"{f.name} plans {rid} with other pins than {plans[0][0].name}")
        merged["not_run"].update(d.get("not_run") or {})
    return merged


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock (flock on the folder itself: no file added to the run): every read-modify-write of
    manifest.json happens inside it, so two imports (or row sessions) into one run each add their row to what the
    other wrote, never to what it read before."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:  # no run yet, so no manifest to change: nothing to hold
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released on close, and by the kernel when a holder dies
        yield
    finally:
        os.close(fd)


def _planned(run_id: str, rows: dict[str, PlannedRow], invocation: Invocation, fingerprint: Fingerprint) -> Manifest:
    """A manifest as a run plans it, before any row has run."""
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "created": now(),
        "fingerprint": fingerprint,
        "invocation": invocation,
        "rows": dict(rows),
        "not_run": {},
        "resumed": [],
    }


def ensure(
    run_dir: Path, run_id: str, rows: dict[str, PlannedRow], invocation: Invocation, fingerprint: Fingerprint
) -> Manifest:
    """The run's manifest, written now if the run has none; an existing one (--resume, the next row of the same nox
    invocation, another import into the run) gains the rows it lacks and keeps the rest as planned."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with _locked(run_dir):
        current = _read_file(path(run_dir))
        if current is None:
            current = _planned(run_id, rows, invocation, fingerprint)
            atomic_write_json(path(run_dir), current)
            return current
        added = {rid: r for rid, r in rows.items() if rid not in current["rows"]}
        if added or invocation.get("argv") != (current.get("invocation") or {}).get("argv"):
            current["rows"].update(added)
            resumed = current.setdefault("resumed", [])
            if not resumed or resumed[-1].get("argv") != invocation.get("argv"):
                resumed.append({"at": now(), "argv": invocation.get("argv"), "rows": sorted(rows)})
            atomic_write_json(path(run_dir), current)
        return current


def changed_rows(current: Manifest | None, rows: dict[str, PlannedRow]) -> dict[str, str]:
    """{row id: what changed} for each planned row whose plan now differs (pins, Python, torch build, constraints)."""
    out = {}
    for rid, now_row in rows.items():
        was = ((current or {}).get("rows") or {}).get(rid)
        if was is None:
            continue
        diffs = [
            k
            for k in ("pins", "python", "torch_backend", "constraints_sha256", "candidate")
            if k in was and k in now_row and was[k] != now_row[k]
        ]
        if diffs:
            out[rid] = ", ".join(diffs)
    return out


def replan(run_dir: Path, rows: dict[str, PlannedRow]) -> None:
    """Plan ``rows`` again (their constraints changed: they run again with the new ones)."""
    with _locked(run_dir):
        current = _read_file(path(run_dir))
        if current is None:
            return
        current["rows"].update(rows)
        atomic_write_json(path(run_dir), current)


def mark_not_run(run_dir: Path, row_id: str, why: str) -> None:
    """Record why a planned row has no record (its session stopped on bad input before writing one)."""
    with _locked(run_dir):
        current = read(run_dir)
        if current is None:
            return
        current.setdefault("not_run", {})[row_id] = why
        atomic_write_json(path(run_dir), current)


def clear_not_run(run_dir: Path, row_id: str) -> None:
    """The row started after all (a resumed run): no reason to keep for its absence."""
    with _locked(run_dir):
        current = _read_file(path(run_dir))
        if current is not None and row_id in (current.get("not_run") or {}):
            current["not_run"].pop(row_id)
            atomic_write_json(path(run_dir), current)


def write_named(
    run_dir: Path,
    name: str,
    run_id: str,
    rows: dict[str, PlannedRow],
    invocation: Invocation,
    fingerprint: Fingerprint,
) -> Path:
    """A pipeline's plan of the whole run, written before any row starts, as ``manifest-<name>.json``."""
    f = Path(run_dir) / f"manifest-{name}.json"
    atomic_write_json(f, _planned(run_id, rows, invocation, fingerprint))
    return f
