"""A run's manifest, ``results/<run-id>/manifest.json``: what the run planned, fixed when its first row starts.

    {"schema": 1, "run_id", "created", "fingerprint": evidence.fingerprint.describe(),
     "invocation": {"argv", "tiers", "overrides", "server_urls", "pytest_args", "knobs"},
     "rows": {row id: {"pins", "python", "torch_backend", "constraints_sha256"}},
     "not_run": {row id: why}, "resumed": [{"at", "argv"}]}

The report judges every record against it (evidence.judge): a planned row without a record is "not run" (with the
reason its session gave, ``not_run``), a record the plan does not name, or one whose pins, overrides, knobs or suite
differ from the plan's, proves nothing for this run. Resuming a run adds rows to the plan but never rewrites a row
already planned: a row whose constraints changed since is run again (``changed_rows``), not kept with its old pins.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from pathlib import Path

from mtpmatrix.atomic import atomic_write_json, read_json

FILE = "manifest.json"
SCHEMA = 1


class ManifestError(ValueError):
    """A manifest that cannot be read or does not fit the run; one line."""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def planned_row(row_dict: dict, constraints_text: str | None = None) -> dict:
    """What the plan fixes of a row (``Row.as_dict()``): its pins, Python, torch build and the constraints file's
    checksum."""
    out = {"pins": dict(row_dict.get("pins") or {}), "python": row_dict.get("python"),
           "torch_backend": row_dict.get("torch_backend")}
    if constraints_text is not None:
        out["constraints_sha256"] = hashlib.sha256(constraints_text.encode()).hexdigest()
    return out


def path(run_dir: Path) -> Path:
    return Path(run_dir) / FILE


def read(run_dir: Path) -> dict | None:
    """The run's manifest; None when it has none (a run written before manifests); ManifestError when unreadable."""
    f = path(run_dir)
    if not f.is_file():
        return None
    try:
        data = read_json(f)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{f}: unreadable ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), dict) or not all(
            isinstance(v, dict) for v in data["rows"].values()):
        raise ManifestError(f"{f}: not a run manifest (no 'rows' object)")
    return data


def ensure(run_dir: Path, run_id: str, rows: dict[str, dict], invocation: dict, fingerprint: dict) -> dict:
    """The run's manifest, written now if the run has none; an existing one (--resume, the next row of the same nox
    invocation, another import into the run) gains the rows it lacks and keeps the rest as planned."""
    current = read(run_dir)
    if current is None:
        current = {"schema": SCHEMA, "run_id": run_id, "created": now(), "fingerprint": fingerprint,
                   "invocation": invocation, "rows": dict(rows), "not_run": {}, "resumed": []}
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


def changed_rows(current: dict | None, rows: dict[str, dict]) -> dict[str, str]:
    """{row id: what changed} for each planned row whose plan now differs (pins, Python, torch build, constraints)."""
    out = {}
    for rid, now_row in rows.items():
        was = ((current or {}).get("rows") or {}).get(rid)
        if was is None:
            continue
        diffs = [k for k in ("pins", "python", "torch_backend", "constraints_sha256")
                 if k in was and k in now_row and was[k] != now_row[k]]
        if diffs:
            out[rid] = ", ".join(diffs)
    return out


def replan(run_dir: Path, rows: dict[str, dict]) -> None:
    """Plan ``rows`` again (their constraints changed: they run again with the new ones)."""
    current = read(run_dir)
    if current is None:
        return
    current["rows"].update(rows)
    atomic_write_json(path(run_dir), current)


def mark_not_run(run_dir: Path, row_id: str, why: str) -> None:
    """Record why a planned row has no record (its session stopped on bad input before writing one)."""
    current = read(run_dir)
    if current is None:
        return
    current.setdefault("not_run", {})[row_id] = why
    atomic_write_json(path(run_dir), current)


def clear_not_run(run_dir: Path, row_id: str) -> None:
    """The row started after all (a resumed run): no reason to keep for its absence."""
    current = read(run_dir)
    if current is not None and row_id in (current.get("not_run") or {}):
        current["not_run"].pop(row_id)
        atomic_write_json(path(run_dir), current)
