"""``python -m mtpmatrix import OUT --row ROW``: file a GPU box's run (``tools/gpu_box.sh OUT``) into the results
store as ``results/<run-id>/<ROW>/``, so boxes without nox feed the same report and ``--baseline``.

OUT is what gpu_box.sh leaves: ``tiers.json``, ``junit.xml``, ``pytest.log``, ``env.txt``, ``invocation.json`` (its
pytest args and MTPMATRIX_* knobs) and ``logs.tgz`` (the server logs and GSM8K records of its work folder). The row
folder gets the schema.py layout: server logs at its top, per-question records under ``gsm8k/``, metric paths
relative to it (older boxes recorded absolute box paths and ``gsm8k-<case>.jsonl`` names: rewritten here), tier
verdicts derived again (expected.judge_tiers: the box's stored known-upstream tags and verdicts are stripped and the
current list applied), and a row.json built from the row's constraints file and what the box reported. Nothing is
written unless all of it works: the folder is assembled beside the run (``.import-<row>-<pid>/``, which no reader of
the store takes for a row) and renamed into place, so a killed import leaves no half row; the next import of the row
removes what a killed one left.

Only evidence bound to its run is filed: gpu_box.sh gives each run a fresh ``invocation_id`` (invocation.json) and
hands it to pytest as MTPMATRIX_INVOCATION_ID, which the plugin records in tiers.json's ``selection.knobs``. A
tiers.json without that id, or with another, is an earlier run's (pytest wrote none this time: a usage error, a kill,
an OOM) and is refused, as is an output without junit.xml or pytest.log, one from before invocation ids, and a
tiers.json that is not the plugin's shape: each in one line (ImportInputError), nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path, PurePosixPath
from typing import cast

from mtpmatrix.core import expected, known_upstream, schema
from mtpmatrix.core.atomic import MAX_RECORD_BYTES, atomic_write_json, refused_unread
from mtpmatrix.core.evidence import fingerprint, manifest, records
from mtpmatrix.core.paths import CONSTRAINTS_DIR, NameError_, new_run_id, single_name
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import Row, RowError, load_rows
from mtpmatrix.core.store import RECORD_SUFFIXES, row_verdict

OUT_FILES = (schema.JUNIT_FILE, schema.PYTEST_LOG, schema.ENV_FILE, schema.INVOCATION_FILE)
REQUIRED_FILES = (schema.TIERS_FILE, schema.JUNIT_FILE, schema.PYTEST_LOG)  # every gpu_box.sh run whose pytest ran
LOGS_TGZ = "logs.tgz"
INVOCATION_KNOB = "MTPMATRIX_INVOCATION_ID"  # gpu_box.sh's invocation id, as the pytest plugin records it
PATCH_MARK = "mtpmatrix-mutant:"  # the fault-injection hook's log lines (faults/catalogue.MARK)
STAGE_PREFIX = ".import-"  # a row being assembled: .import-<row>-<pid> (hidden: the store never reads it)
IMPORTED = "imported"  # install verdict of an imported row: the box's own environment, not installed by the matrix


class ImportInputError(ValueError):
    """Bad input for the import (no tiers.json, evidence of another run, unknown row, row already in the run); one
    line."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _read_json(path: Path):
    """A JSON file of the box; ImportInputError (one line) when it is not UTF-8 JSON."""
    if path.is_symlink():
        raise ImportInputError(f"{path}: a link (import reads only OUT's own files, never what a link points at)")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ImportInputError(f"{path}: unreadable ({_one_line(exc)})") from None
    except RecursionError:
        raise ImportInputError(f"{path}: unreadable (JSON nested too deeply)") from None


def _not_an_object(value) -> bool:
    return value is not None and not isinstance(value, dict)


def _not_strings(value) -> bool:
    return value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value))


def shape_error(data) -> str | None:
    """What keeps ``data`` from being a tiers.json as the pytest plugin writes it (None: nothing): every place the
    import reads, with the type it reads it as."""
    if not isinstance(data, dict):
        return f"not a tiers.json of the mtpmatrix pytest plugin (a JSON {type(data).__name__}, not an object)"
    if not isinstance(data.get("tiers"), dict):
        return "no 'tiers' (not written by the mtpmatrix pytest plugin)"
    for key in ("selection", "versions", "fingerprint"):
        if _not_an_object(data.get(key)):
            return f"'{key}' is not an object"
    if any(v is not None and not isinstance(v, str) for v in (data.get("versions") or {}).values()):
        return "'versions' is not an object of version strings"
    gpus = data.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        return f"'gpus' is {gpus!r}, not a whole number of GPUs"
    selection = data.get("selection") or {}
    for key in ("knobs", "sglang_env", "torch_env", "collected"):
        if _not_an_object(selection.get(key)):
            return f"'selection.{key}' is not an object"
    for key in ("args", "paths", "deselect"):
        if _not_strings(selection.get(key)):
            return f"'selection.{key}' is not a list of strings"
    if any(_not_strings(ids) for ids in (selection.get("collected") or {}).values()):
        return "'selection.collected' is not an object of check-id lists"
    problems = records.tiers_problems(data["tiers"])  # the shape every reader of a record relies on
    if problems:
        return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    return None


def _row_relative(name: str) -> str | None:
    """Where a file of the box's work folder goes in the row folder (None: not kept)."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == "tiny":
        return None
    if len(p.parts) == 1 and p.name.startswith("gsm8k-") and p.suffix == ".jsonl":  # before schema 2
        return schema.gsm8k_records(p.name[len("gsm8k-") : -len(".jsonl")])
    if len(p.parts) == 1 and p.name in (schema.TIERS_FILE, schema.ROW_FILE, *OUT_FILES):
        return None  # OUT's own files (tiers.json, junit.xml, ...) are the ones that count; row.json is the import's
    return str(p)


def _extract_logs(tgz: Path, dest: Path) -> list[str]:
    """Regular files of ``tgz`` into ``dest`` under their row-folder names (nothing outside ``dest``)."""
    kept = []
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            for m in tar.getmembers():
                rel = _row_relative(m.name.removeprefix("./")) if m.isfile() else None
                if rel is None:
                    continue
                if rel.endswith(RECORD_SUFFIXES) and m.size > MAX_RECORD_BYTES:  # the report would refuse the row
                    raise ImportInputError(
                        f"{tgz}: {rel} is {m.size / 2**20:.1f} MiB, over the {MAX_RECORD_BYTES // 2**20} MiB a "
                        "record file may be: not imported"
                    )
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(target, "wb") as fh:  # type: ignore[union-attr]  # m.isfile()
                    shutil.copyfileobj(src, fh)
                kept.append(rel)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ImportInputError(f"{tgz}: unreadable ({type(exc).__name__}: {exc})") from None
    return kept


def _metric_path(value, kept: set[str], to_records: bool) -> str | None:
    """A metric path of the box (absolute, or a bare name) as a row-relative one that was imported."""
    if not isinstance(value, str) or not value:
        return None
    rel = _row_relative(PurePosixPath(value).name) if to_records else PurePosixPath(value).name
    if to_records and value in kept:
        rel = value
    return rel if rel in kept else None


def rewrite_metrics(tiers: dict, kept: set[str]) -> dict:
    """Make the box's metric paths row-relative (schema.SERVER_LOG, schema.RECORDS); a file the box did not ship
    loses its metric rather than pointing at the box. Older tiers put the speed-up inside vs_nomtp: lifted out."""
    for tier in tiers.values():
        for chk in tier.get("checks") or []:
            m = chk.get("metrics") or {}
            for key, to_records in ((schema.SERVER_LOG, False), (schema.RECORDS, True)):
                if key in m:
                    rel = _metric_path(m[key], kept, to_records)
                    if rel is None:
                        m.pop(key)
                    else:
                        m[key] = rel
            vs = m.get(schema.VS_NOMTP)
            if isinstance(vs, dict) and "speedup" in vs and schema.SPEEDUP not in m:
                m[schema.SPEEDUP] = vs.pop("speedup")
    return tiers


def _env(out: Path) -> tuple[list[str], str | None]:
    f = out / schema.ENV_FILE
    lines = f.read_text(errors="replace").splitlines() if f.is_file() else []
    when = None
    if lines:
        try:
            when = _dt.datetime.fromisoformat(lines[0].strip().replace("Z", "+00:00")).isoformat(timespec="seconds")
        except ValueError:
            pass
    return lines, when


def _invocation(out: Path) -> dict:
    """gpu_box.sh's invocation.json, with the invocation id that binds its tiers.json to it."""
    f = out / schema.INVOCATION_FILE
    data = _read_json(f) if f.is_file() else {}
    if not isinstance(data, dict):
        raise ImportInputError(f"{f}: not an object (a JSON {type(data).__name__})")
    invocation_id = data.get("invocation_id")
    if not isinstance(invocation_id, str) or not invocation_id:
        raise ImportInputError(
            f"{out}: the box output predates verified invocations (no invocation_id in its "
            f"{schema.INVOCATION_FILE}, so nothing shows its {schema.TIERS_FILE} is this run's): re-run "
            "it with the current tools/gpu_box.sh"
        )
    if _not_an_object(data.get("knobs")) or _not_strings(data.get("pytest_args")):
        raise ImportInputError(
            f"{f}: not gpu_box.sh's (its 'knobs' must be an object, its 'pytest_args' a list of strings)"
        )
    patch = data.get("patch")
    if patch is not None and not (
        isinstance(patch, dict)
        and isinstance(patch.get("sha256"), str)
        and re.fullmatch("[0-9a-f]{64}", patch["sha256"])  # it names the row's folder: hex, never a path
        and not _not_strings(patch.get("files"))
        and isinstance(patch.get("draft_phase"), (int, type(None)))
    ):
        raise ImportInputError(f"{f}: its 'patch' is not gpu_box.sh's (sha256, files, draft_phase)")
    return data


def candidate_of(out: Path, invocation: dict, data: dict, row_id: str, logs: list[Path]) -> dict | None:
    """row.json's ``candidate`` of a box run with ``PATCH=FILE`` (invocation.json's ``patch``), once its suite is
    shown to have run with that patch served: tiers.json records the same sha256 (the hook checks the file against
    it) and no log of the run (``logs``) says the hook did NOT apply it. None without a patch; ImportInputError
    otherwise."""
    patch = invocation.get("patch")
    if patch is None:
        return None
    ran = ((data.get("selection") or {}).get("knobs") or {}).get(schema.PATCH_SHA256_ENV)
    if ran != patch["sha256"]:
        raise ImportInputError(
            f"{out}: {schema.INVOCATION_FILE} names patch {patch['sha256'][:12]}, its suite ran with "
            f"{schema.PATCH_SHA256_ENV}={str(ran)[:12]}"
        )
    for f in logs:  # pytest.log and each server's: every process that imported sglang
        text = f.read_text(errors="replace") if f.is_file() else ""
        bad = next((ln for ln in text.splitlines() if PATCH_MARK in ln and "NOT applied" in ln), None)
        if bad:
            raise ImportInputError(f"{out}: the patch was not served ({f.name}: {bad.strip()[:160]})")
    return {
        "kind": "patch",
        "path": patch.get("path"),
        "sha256": patch["sha256"],
        "files": list(patch["files"]),
        "base_row": row_id,
        **({"draft_phase": patch["draft_phase"]} if patch.get("draft_phase") is not None else {}),
    }


def verified_evidence(out: Path) -> tuple[dict, dict]:
    """(tiers.json, invocation.json) of gpu_box.sh's ``out``, once they are shown to be one run's: every file a run
    writes is there, tiers.json has the plugin's shape and carries the invocation's id. ImportInputError (one line)
    otherwise. A file of OUT that is a link is refused: the import copies what OUT holds, never what a link points
    at elsewhere on the box."""
    for name in (*REQUIRED_FILES, *OUT_FILES, LOGS_TGZ):
        if (out / name).is_symlink():
            raise ImportInputError(
                f"{out / name}: a link (to {os.readlink(out / name)}); import copies only OUT's own files"
            )
    for name in REQUIRED_FILES:
        if not (out / name).is_file():
            raise ImportInputError(
                f"{out}: no {name} (expected a tools/gpu_box.sh output folder whose pytest ran to its end)"
            )
    for name in (schema.TIERS_FILE, schema.JUNIT_FILE, schema.INVOCATION_FILE, schema.ENV_FILE):
        why = refused_unread(out / name)  # before any of it is read
        if why:
            raise ImportInputError(why)
    tiers_file = out / schema.TIERS_FILE
    data = _read_json(tiers_file)
    why = shape_error(data)
    if why:
        raise ImportInputError(f"{tiers_file}: {why}")
    invocation = _invocation(out)
    expected_id = invocation["invocation_id"]
    recorded = ((data.get("selection") or {}).get("knobs") or {}).get(INVOCATION_KNOB)
    if recorded != expected_id:
        got = f"its {INVOCATION_KNOB} is {recorded!r}" if recorded is not None else f"it records no {INVOCATION_KNOB}"
        raise ImportInputError(
            f"{out}: {schema.TIERS_FILE} is not from this invocation ({got}; "
            f"{schema.INVOCATION_FILE} says {expected_id!r}): another run's (did this run's pytest "
            "write none? see pytest.log)"
        )
    return data, invocation


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_dead_stages(run_dir: Path, row_id: str) -> list[Path]:
    """Remove the staging folders of ``row_id`` in ``run_dir`` whose import is no longer alive (killed: the
    rename never came). Another row's, or a live import's, are left alone. Returns what was removed."""
    prefix = f"{STAGE_PREFIX}{row_id}-"
    removed = []
    for folder in run_dir.iterdir() if run_dir.is_dir() else ():
        pid = folder.name[len(prefix) :]
        if folder.name.startswith(prefix) and pid.isascii() and pid.isdigit() and int(pid) > 0 and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the import files the row: ``base``, the row's constraints, as ``row_id`` (``base.id``, or a candidate's
    own id) in ``results/run_id``."""

    base: Row
    row_id: str
    run_id: str
    run_dir: Path

    @property
    def dest(self) -> Path:
        return self.run_dir / self.row_id


def import_run(
    out: Path, row_id: str, *, results: Path, run_id: str | None = None, constraints: Path | None = None
) -> tuple[Path, RowRecord]:
    """Import gpu_box.sh's ``out`` as row ``row_id``; returns (row folder, row record)."""

    out = Path(out)
    data, invocation = verified_evidence(out)
    try:
        issues = known_upstream.load()
    except ValueError as exc:  # this checkout's list is at fault, not the box's tiers.json
        raise ImportInputError(f"the known upstream list: {_one_line(exc)}") from None
    target = import_target(row_id, invocation, results, run_id, constraints)
    stage = fresh_stage(target)
    try:
        record = assemble(stage, out, data, invocation, issues, target)
        try:
            os.rename(stage, target.dest)  # one step: the row appears whole or not at all
        except OSError as exc:  # another import of the row finished first
            raise ImportInputError(
                f"{target.dest} already exists: import into another --run-id ({_one_line(exc)})"
            ) from None
    except OSError as exc:  # a disk that fills or a file that cannot be read: nothing filed, one line
        shutil.rmtree(stage, ignore_errors=True)
        raise ImportInputError(f"{target.dest}: could not assemble the row ({_one_line(exc)})") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return target.dest, record


def import_target(row_id: str, invocation: dict, results: Path, run_id: str | None, constraints: Path | None) -> Target:
    """The row (a known one; a candidate's filed under its own id, runner/candidate.py) and the run it goes into,
    where it is not yet; ImportInputError (one line) otherwise."""
    try:
        rows = {r.id: r for r in load_rows(constraints or CONSTRAINTS_DIR)}
    except RowError as exc:
        raise ImportInputError(str(exc)) from None
    if row_id not in rows:
        raise ImportInputError(f"--row {row_id!r} is not a row; known: {', '.join(rows)}")
    base_id = row_id
    if invocation.get("patch"):  # a candidate: filed under its own id (runner/candidate.py)
        row_id = f"{base_id}+patch-{invocation['patch']['sha256'][:7]}"
    try:
        run_id = new_run_id() if run_id is None else single_name(run_id, "--run-id")
    except NameError_ as exc:  # a path would file the row outside the results root
        raise ImportInputError(str(exc)) from None
    run_dir = Path(results) / run_id
    if run_dir.is_symlink():
        raise ImportInputError(f"{run_dir}: a link; import files rows only into the results root's own folders")
    target = Target(rows[base_id], row_id, run_id, run_dir)
    if target.dest.exists():
        raise ImportInputError(f"{target.dest} already exists: import into another --run-id")
    return target


def fresh_stage(target: Target) -> Path:
    """An empty staging folder for the row beside the run (what killed imports of the row left removed)."""
    target.run_dir.mkdir(parents=True, exist_ok=True)
    remove_dead_stages(target.run_dir, target.row_id)
    stage = target.run_dir / f"{STAGE_PREFIX}{target.row_id}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    return stage


def assemble(stage: Path, out: Path, data: dict, invocation: dict, issues: list, target: Target) -> RowRecord:
    """The row folder in ``stage``: OUT's files, the server logs and records, tiers.json judged again, row.json, and
    the row planned in the run's manifest."""
    for name in OUT_FILES:
        if (out / name).is_file():
            shutil.copy2(out / name, stage / name)
    kept = set(_extract_logs(out / LOGS_TGZ, stage)) if (out / LOGS_TGZ).is_file() else set()
    cand = candidate_of(
        out,
        invocation,
        data,
        target.base.id,
        [out / schema.PYTEST_LOG, *(stage / k for k in sorted(kept) if k.endswith(".log"))],
    )
    versions = {k: v for k, v in (data.get("versions") or {}).items() if v}
    try:
        tiers = expected.judge_tiers(rewrite_metrics(data["tiers"], kept), data.get("selection"), versions, issues)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:  # a shape shape_error does not look at
        raise ImportInputError(
            f"{out / schema.TIERS_FILE}: not a tiers.json of the mtpmatrix pytest plugin "
            f"({type(exc).__name__}: {_one_line(exc)})"
        ) from None
    atomic_write_json(stage / schema.TIERS_FILE, dict(data, tiers=tiers, schema=schema.SCHEMA))
    row = dataclasses.replace(target.base, id=target.row_id)
    record = row_record(out, data, invocation, tiers, versions, cand, row, target.run_id)
    atomic_write_json(stage / schema.ROW_FILE, record)
    # the run plans this row as this checkout knows it: its pins, and the suite that will judge it (a box that
    # ran another suite shows up as a record of another suite, evidence/judge.py)
    manifest.ensure(
        target.run_dir,
        target.run_id,
        {
            row.id: manifest.planned_row(
                row.as_dict(), row.path.read_text(), candidate=manifest.candidate_identity(cand)
            )
        },
        {
            "argv": ["import", str(out), "--row", target.base.id],
            "source": "tools/gpu_box.sh",
            "overrides": [],
            "pytest_args": record["pytest_args"],
            "knobs": record["knobs"],
        },
        fingerprint.describe(),
    )
    return record


def row_record(
    out: Path, data: dict, invocation: dict, tiers: dict, versions: dict, cand: dict | None, row: Row, run_id: str
) -> RowRecord:
    """row.json of the imported row: the row's constraints, what the box was asked and what it reported."""
    selection = data.get("selection")
    env_lines, when = _env(out)
    record: RowRecord = {
        "schema": schema.SCHEMA,
        "run_id": run_id,
        "row": row.as_dict(),
        **({"candidate": cand} if cand else {}),
        "overrides": [],
        # what the box was asked (gpu_box.sh's invocation.json; else what its pytest session recorded)
        "pytest_args": invocation.get("pytest_args", (selection or {}).get("args")) or [],
        "knobs": expected.knobs(invocation.get("knobs") or (selection or {}).get("knobs") or {}),
        "selection": selection,
        "fingerprint": data.get("fingerprint"),  # the suite that wrote the records (evidence/fingerprint.py)
        "tiers_selected": ",".join(t for t, tv in tiers.items() if "not selected" not in str(tv.get("reason") or "")),
        "started": when,
        "finished": when,
        "host": {"imported_from": str(out.resolve()), "env": env_lines[:12]},
        "install": {"verdict": IMPORTED, "source": "the GPU box's own environment (tools/gpu_box.sh)"},
        "versions": versions,
        "suite": {"exitstatus": data.get("exitstatus"), "seconds": data.get("seconds")},
        "tiers": tiers,
        "gpus": data.get("gpus", 0),
        # how the session ran (evidence/session.py)
        **cast(RowRecord, {k: data[k] for k in schema.SESSION_FIELDS if k in data}),
    }
    record["verdict"] = row_verdict(record)
    return record


def pin_mismatches(record: RowRecord) -> list[str]:
    """Main packages whose version on the box differs from the row's pins (the row may not describe the box)."""
    pins = (record.get("row") or {}).get("pins") or {}
    got = record.get("versions") or {}
    return [
        f"{p} {got[p]} (row pins {pins[p]})"
        for p in ("sglang", "transformers", "torch")
        if p in pins and got.get(p) and got[p].split("+")[0] != pins[p]
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, metavar="OUT", help="a tools/gpu_box.sh output folder")
    p.add_argument("--row", required=True, help="the row (constraints/<ROW>.txt) the box ran")


def run(ns: argparse.Namespace) -> int:
    from mtpmatrix.runner.matrix import summary_line

    try:
        dest, record = import_run(ns.out, ns.row, results=ns.results, run_id=ns.run_id)
    except ImportInputError as exc:  # one line, whatever a path in it holds
        print("error: " + str(exc).replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
        return 2
    for m in pin_mismatches(record):
        print(f"warning: {ns.row}: the box ran {m}", file=sys.stderr)
    print(summary_line(record))
    print(f"imported: {dest}  (nox -s report -- {record['run_id']})")
    return 0
