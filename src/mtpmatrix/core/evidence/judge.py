"""One row's evidence, judged: does its record show which suite, which versions and which settings ran, in this run,
whole? Each answer that is "no" is a problem (``{"tier": tier or None for the whole row, "what": one line}``); a
tier with a problem proves nothing (the report makes it "not proven", whatever its checks say).

What is checked, each against something the record did not write itself:
  run and row     row.json's run id and row id are the folder's; the manifest plans the row, with the same pins
                  (here)
  suite           the record's fingerprint is the manifest's (and the manifest's is this checkout's: run-level) (here)
  versions        the installed sglang, transformers, torch (and every other pin recorded) are the row's pins, with
                  exact --with overrides applied; the overrides are the manifest's (versions.py)
  settings        no MTPMATRIX_* knob that changes what is tested, no SGLANG_* variable; what the invocation asked
                  (its pytest args, its knobs) is what the session recorded (environment.py)
  served, metrics a --server-url case was served by the row's sglang at its pair's TP; a TP-2 case that passed on
                  its own servers had the GPUs for it; a passed check's numbers agree with its outcome: finite,
                  within the case's threshold, counts that add up to the per-question records (checks.py)
  files           tiers.json and junit.xml beside the record say the same outcome for every check (junit.xml's
                  xfail, how the suite writes a known-upstream failure, is a failure's) (record_files.py)
  session         how the session ran (pytest's plugins, options, conftests; reruns; GPUs) and on which build
                  (Python, platform, torch's) (session.py)
"""

from __future__ import annotations

from pathlib import Path

from mtpmatrix.core.evidence import checks, environment, record_files, session, versions
from mtpmatrix.core.evidence import manifest as run_manifest
from mtpmatrix.core.evidence.versions import pins_with_overrides
from mtpmatrix.core.record_types import Manifest, Problem, RowRecord, problem

__all__ = ["judge_row", "pins_with_overrides"]  # report/summary.py imports pins_with_overrides from here


def judge_row(
    row_id: str, record: RowRecord, *, run_id: str, manifest: Manifest | None, row_dir: Path | None = None
) -> list[Problem]:
    """Every problem with ``record`` (filed as ``run_id``/``row_id``) as evidence; [] when it shows what it claims.
    ``record`` must have a sound shape (evidence.records.shape_problems)."""
    out: list[Problem] = []
    row = record.get("row") or {}
    if row.get("id") != row_id:
        out.append(problem(None, f"row.json names row {row.get('id')!r}, filed as {row_id!r}"))
    fingerprinted = bool((record.get("fingerprint") or {}).get("suite"))
    if record.get("run_id") != run_id and (fingerprinted or record.get("run_id") is not None):
        # a record of this suite always names its run (store.save_row, import): one without is not bound to this one
        out.append(problem(None, f"row.json belongs to run {record.get('run_id')!r}, filed in run {run_id!r}"))
    ran = any(e.get("checks") for e in (record.get("tiers") or {}).values())
    if manifest is not None:
        planned = (manifest.get("rows") or {}).get(row_id)
        if planned is None:
            out.append(problem(None, "the run's manifest does not plan this row"))
        elif planned.get("pins") != row.get("pins"):
            out.append(problem(None, "the row's pins are not the ones the run planned"))
        elif planned.get("candidate") != run_manifest.candidate_identity(record.get("candidate")):
            out.append(problem(None, "the record's candidate is not the one the run planned"))
        asked = (planned or {}).get("overrides", ((manifest.get("invocation") or {}).get("overrides")) or [])
        if sorted(asked) != sorted(record.get("overrides") or []):
            out.append(problem(None, f"overrides {record.get('overrides') or []} are not the run's {asked}"))
        fp = (record.get("fingerprint") or {}).get("suite")
        if ran and fp and fp != (manifest.get("fingerprint") or {}).get("suite"):
            out.append(
                problem(
                    None,
                    f"written by suite {str(fp)[:12]}, the run planned suite "
                    f"{str((manifest.get('fingerprint') or {}).get('suite'))[:12]}",
                )
            )
    if ran and not (record.get("fingerprint") or {}).get("suite"):
        out.append(problem(None, "no suite fingerprint: the record cannot say which suite wrote it"))
    out += versions.judge(record, ran)
    out += environment.judge(record)
    out += checks.judge(record, row_dir)
    if ran:  # how the session ran and on which build
        out += session.judge(record, ((manifest or {}).get("rows") or {}).get(row_id))
    if row_dir is not None and ran:
        out += record_files.judge(record, row_dir)
    seen: dict[tuple[str | None, str], Problem] = {}
    for p in out:
        seen.setdefault((p["tier"], p["what"]), p)
    return list(seen.values())
