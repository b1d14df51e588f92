"""A run's plan, written before its first row installs (evidence/manifest.py): which rows this nox invocation will
run, with which pins, options, knobs and suite; and what --resume may keep of an earlier row.

The rows planned are every row session nox queued for this invocation (all shards of a sharded run: the report of
one shard then says the others did not run), read from nox's own queue; where that cannot be read, every row the
session could run, so a row never silently drops out of the plan.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from mtpmatrix.core import expected, paths
from mtpmatrix.core.evidence import fingerprint, manifest
from mtpmatrix.core.record_types import Invocation, PlannedRow
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import candidate


def queued_rows(session, fallback: list[str]) -> list[str]:
    """The row ids of every session of ``session``'s kind that nox queued (or ran) in this invocation."""
    try:
        runner = session._runner  # nox's queue is not public API: read defensively, fall back to every row
        queue = itertools.chain(runner.manifest._consumed, runner.manifest._queue)
        ids = [
            s.func.call_spec["row"]
            for s in queue
            if s.name == runner.name
            and isinstance(getattr(s.func, "call_spec", None), dict)
            and "row" in s.func.call_spec
        ]
    except (AttributeError, KeyError, TypeError):
        ids = []
    return ids or list(fallback)


def planned(rows: dict, ids: list[str], cand=None) -> dict[str, PlannedRow]:
    """{row id: manifest.planned_row} of ``ids`` (rows: {id: core.rows.Row}); with a candidate
    (runner/candidate.py), each row planned under its candidate's id, with the candidate's identity."""
    return {
        candidate.filed_id(rid, cand): manifest.planned_row(
            rows[rid].as_dict(), rows[rid].path.read_text(), candidate=candidate.identity(cand)
        )
        for rid in ids
        if rid in rows
    }


def invocation(opts) -> Invocation:
    return {
        "argv": list(sys.argv),
        "tiers": opts.tiers,
        "overrides": list(opts.overrides),
        "server_urls": list(opts.server_urls),
        "pytest_args": list(opts.pytest_args),
        "knobs": expected.knobs(os.environ),
    }


def start(opts, row_id: str, plan: dict[str, PlannedRow]) -> str | None:
    """Write or extend the run's manifest for ``plan`` and say whether --resume may keep ``row_id``'s record: the
    reason to skip it, or None to run it (no record yet, or one whose pins or suite are not the plan's any more)."""
    run_dir = Path(opts.results) / opts.run_id
    current = manifest.read(run_dir)
    changed = manifest.changed_rows(current, {row_id: plan[row_id]})
    suite = fingerprint.describe()
    manifest.ensure(run_dir, opts.run_id, plan, invocation(opts), suite)
    if changed:
        manifest.replan(run_dir, {row_id: plan[row_id]})
    manifest.clear_not_run(run_dir, row_id)
    store = RunStore(opts.results, opts.run_id)
    if not (opts.resume and store.finished(row_id)):
        return None
    if changed:
        return None  # the constraints changed since: run it again with the new pins, never keep the old record
    record = store.load_row(row_id) or {}
    ran = (record.get("fingerprint") or {}).get("suite")
    if ran and ran != suite["suite"]:
        return None  # another suite wrote it
    return f"{row_id} already has a verdict in run {opts.run_id} (--resume)"


def not_run(opts, row_id: str, why: str) -> None:
    """Record why ``row_id`` has no record in the run (bad input, before anything was installed)."""
    if opts is not None and opts.run_id:
        manifest.mark_not_run(Path(opts.results) / opts.run_id, row_id, why)


# ---------------------------------------------------------------------------------------------------------------
# python -m mtpmatrix plan: a pipeline that runs each row as its own job fixes the run's plan before any job starts
# ---------------------------------------------------------------------------------------------------------------

PIPELINE_PLAN = "pipeline"


def add_arguments(p) -> None:
    from mtpmatrix.core import schema

    p.add_argument("run_id", metavar="RUN_ID", help="results/<RUN_ID>/ the row jobs will write")
    p.add_argument("--rows", required=True, metavar="ROW,ROW", help="every row the pipeline starts a job for")
    p.add_argument("--tiers", default=",".join(schema.TIERS))


def run(ns) -> int:
    """Write ``results/<RUN_ID>/manifest-pipeline.json``: the rows, their pins and the suite, before any job runs,
    so a job that never uploads is a planned row without a record ("not run"), not a row that vanished."""
    from mtpmatrix.core import schema
    from mtpmatrix.core.rows import RowError, load_rows, parse_override

    try:
        paths.single_name(ns.run_id, "RUN_ID")
    except paths.NameError_ as exc:  # a path would write the plan outside the results root
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        table = {r.id: r for r in load_rows(paths.CONSTRAINTS_DIR)}
        ids = schema.comma_list(ns.rows)
        unknown = [r for r in ids if r not in table]
        if unknown or not ids:
            raise RowError(f"--rows: unknown row(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(table)}")
        for spec in ns.overrides:  # as the row jobs will read them: a spec they refuse is refused here first
            parse_override(spec)
        tiers = schema.parse_tiers(ns.tiers)
        if not tiers or [t for t in tiers if t not in schema.TIERS]:
            raise RowError(f"--tiers {ns.tiers!r}: known tiers are {', '.join(schema.TIERS)}")
    except RowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    invocation: Invocation = {
        "argv": list(sys.argv),
        "tiers": ns.tiers,
        "overrides": list(ns.overrides),
        "server_urls": [],
        "pytest_args": [],
        "knobs": expected.knobs(os.environ),
    }
    f = manifest.write_named(
        Path(ns.results) / ns.run_id, PIPELINE_PLAN, ns.run_id, planned(table, ids), invocation, fingerprint.describe()
    )
    print(f"planned {len(ids)} row(s) of run {ns.run_id}: {f}")
    return 0
