"""``python -m mtpmatrix import OUT --row ROW``: file a GPU box's run (``tools/gpu_box.sh OUT``) into the results
store as ``results/<run-id>/<ROW>/``, so boxes without nox feed the same report and ``--baseline``.

OUT is what gpu_box.sh leaves: ``tiers.json``, ``junit.xml``, ``pytest.log``, ``env.txt``, ``invocation.json`` (its
pytest args and MTPMATRIX_* knobs) and ``logs.tgz`` (the server logs and GSM8K records of its work folder). The row
folder gets the schema.py layout: server logs at its top, per-question records under ``gsm8k/``, metric paths
relative to it (older boxes recorded absolute box paths and ``gsm8k-<case>.jsonl`` names: rewritten here), tier
verdicts derived again (expected.judge_tiers: the box's stored known-upstream tags and verdicts are stripped and the
current list applied), and a row.json built from the row's constraints file and what the box reported. Nothing is
written unless all of it works: the folder is assembled beside the run and renamed into place, so a killed import
leaves no half row.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shutil
import sys
import tarfile
from pathlib import Path, PurePosixPath

from mtpmatrix import expected, schema
from mtpmatrix.runner.rows import RowError, load_rows
from mtpmatrix.atomic import atomic_write_json, read_json
from mtpmatrix.runner.store import new_run_id, row_verdict

OUT_FILES = (schema.JUNIT_FILE, schema.PYTEST_LOG, schema.ENV_FILE, schema.INVOCATION_FILE)
LOGS_TGZ = "logs.tgz"
IMPORTED = "imported"  # install verdict of an imported row: the box's own environment, not installed by the matrix


class ImportError_(ValueError):
    """Bad input for the import (no tiers.json, unknown row, row already in the run); one line."""


def _row_relative(name: str) -> str | None:
    """Where a file of the box's work folder goes in the row folder (None: not kept)."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == "tiny":
        return None
    if len(p.parts) == 1 and p.name.startswith("gsm8k-") and p.suffix == ".jsonl":  # before schema 2
        return schema.gsm8k_records(p.name[len("gsm8k-"):-len(".jsonl")])
    if p.name == schema.TIERS_FILE and len(p.parts) == 1:
        return None  # OUT/tiers.json is the one that counts
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
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(target, "wb") as fh:
                    shutil.copyfileobj(src, fh)
                kept.append(rel)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ImportError_(f"{tgz}: unreadable ({type(exc).__name__}: {exc})") from None
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
            for key, records in ((schema.SERVER_LOG, False), (schema.RECORDS, True)):
                if key in m:
                    rel = _metric_path(m[key], kept, records)
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
    """gpu_box.sh's invocation.json ({} for older boxes, which did not write one)."""
    f = out / schema.INVOCATION_FILE
    if not f.is_file():
        return {}
    try:
        data = read_json(f)
    except (OSError, ValueError) as exc:
        raise ImportError_(f"{f}: unreadable ({exc})") from None
    return data if isinstance(data, dict) else {}


def import_run(out: Path, row_id: str, *, results: Path, run_id: str | None = None,
               constraints: Path | None = None) -> tuple[Path, dict]:
    """Import gpu_box.sh's ``out`` as row ``row_id``; returns (row folder, row record)."""
    from mtpmatrix.runner.matrix import REPO

    out = Path(out)
    tiers_file = out / schema.TIERS_FILE
    if not tiers_file.is_file():
        raise ImportError_(f"{out}: no {schema.TIERS_FILE} (expected a tools/gpu_box.sh output folder)")
    try:
        data = read_json(tiers_file)
    except (OSError, ValueError) as exc:
        raise ImportError_(f"{tiers_file}: unreadable ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tiers"), dict):
        raise ImportError_(f"{tiers_file}: no 'tiers' (not written by the mtpmatrix pytest plugin)")
    try:
        rows = {r.id: r for r in load_rows(constraints or REPO / "constraints")}
    except RowError as exc:
        raise ImportError_(str(exc)) from None
    if row_id not in rows:
        raise ImportError_(f"--row {row_id!r} is not a row; known: {', '.join(rows)}")
    run_id = run_id or new_run_id()
    run_dir = Path(results) / run_id
    dest = run_dir / row_id
    if dest.exists():
        raise ImportError_(f"{dest} already exists: import into another --run-id")
    run_dir.mkdir(parents=True, exist_ok=True)
    stage = run_dir / f".import-{row_id}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        for name in OUT_FILES:
            if (out / name).is_file():
                shutil.copy2(out / name, stage / name)
        kept = set(_extract_logs(out / LOGS_TGZ, stage)) if (out / LOGS_TGZ).is_file() else set()
        versions = {k: v for k, v in (data.get("versions") or {}).items() if v}
        selection = data.get("selection")
        tiers = expected.judge_tiers(rewrite_metrics(data["tiers"], kept), selection, versions)
        invocation = _invocation(out)
        atomic_write_json(stage / schema.TIERS_FILE, dict(data, tiers=tiers, schema=schema.SCHEMA))
        env_lines, when = _env(out)
        row = rows[row_id]
        record = {
            "schema": schema.SCHEMA,
            "run_id": run_id,
            "row": row.as_dict(),
            "overrides": [],
            # what the box was asked (gpu_box.sh's invocation.json; else what its pytest session recorded)
            "pytest_args": invocation.get("pytest_args", (selection or {}).get("args")),
            "knobs": expected.knobs(invocation.get("knobs") or (selection or {}).get("knobs") or {}),
            "selection": selection,
            "tiers_selected": ",".join(t for t, tv in tiers.items()
                                       if "not selected" not in str(tv.get("reason") or "")),
            "started": when,
            "finished": when,
            "host": {"imported_from": str(out.resolve()), "env": env_lines[:12]},
            "install": {"verdict": IMPORTED, "source": "the GPU box's own environment (tools/gpu_box.sh)"},
            "versions": versions,
            "suite": {"exitstatus": data.get("exitstatus"), "seconds": data.get("seconds")},
            "tiers": tiers,
            "gpus": data.get("gpus", 0),
        }
        record["verdict"] = row_verdict(record)
        atomic_write_json(stage / schema.ROW_FILE, record)
        os.rename(stage, dest)  # one step: the row appears whole or not at all
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return dest, record


def pin_mismatches(record: dict) -> list[str]:
    """Main packages whose version on the box differs from the row's pins (the row may not describe the box)."""
    pins = (record.get("row") or {}).get("pins") or {}
    got = record.get("versions") or {}
    return [f"{p} {got[p]} (row pins {pins[p]})" for p in ("sglang", "transformers", "torch")
            if p in pins and got.get(p) and got[p].split("+")[0] != pins[p]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, metavar="OUT", help="a tools/gpu_box.sh output folder")
    p.add_argument("--row", required=True, help="the row (constraints/<ROW>.txt) the box ran")
    p.add_argument("--run-id", help="results/<RUN_ID>/ to add the row to (default: a new UTC timestamp)")
    p.add_argument("--results", type=Path, default=schema.results_root(),
                   help="results root (default: results, env MTPMATRIX_RESULTS_ROOT)")


def run(ns: argparse.Namespace) -> int:
    from mtpmatrix.runner.matrix import summary_line

    try:
        dest, record = import_run(ns.out, ns.row, results=ns.results, run_id=ns.run_id)
    except ImportError_ as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for m in pin_mismatches(record):
        print(f"warning: {ns.row}: the box ran {m}", file=sys.stderr)
    print(summary_line(record))
    print(f"imported: {dest}  (nox -s report -- {record['run_id']})")
    return 0
