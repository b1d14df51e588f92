"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

RECORDED_RUNS = Path(__file__).parent / "data" / "runs"


@pytest.fixture
def results(tmp_path) -> Path:
    """A copy of the hand-made results store in data/runs (the report and bisect write into runs)."""
    from evidence_records import stamp_all

    dest = tmp_path / "results"
    shutil.copytree(RECORDED_RUNS, dest)
    stamp_all(dest)  # today's evidence on each (the hand-made records predate manifests and fingerprints)
    # "latest run" goes by the times the runs recorded (their rows' finished times), never by file times
    return dest


@pytest.fixture
def judged_as_collected(monkeypatch):
    """Made-up suites' records judged against what their sessions collected, not the project's expected checks:
    for tests of mechanics (bisect, canaries, merging), never of what qualifies (evidence/expected_checks.py)."""
    from mtpmatrix.core.evidence import expected_checks

    monkeypatch.setenv(expected_checks.ENV, expected_checks.AS_COLLECTED)


@pytest.fixture
def h200_run(tmp_path):
    """(results root, run folder) of the real H200 smoke record filed by ``import`` as today's suite would have
    written it: a run whose evidence holds."""
    from evidence_records import H200_ROW, h200_record, write_box

    from mtpmatrix.runner import importer

    results = tmp_path / "results"
    importer.import_run(write_box(tmp_path / "box", h200_record()), H200_ROW, results=results, run_id="h200")
    return results, results / "h200"
