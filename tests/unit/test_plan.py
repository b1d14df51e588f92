"""The run's plan (runner/plan.py, evidence/manifest.py): written before the first row installs, every row nox
queued; --resume keeps a finished row only while its constraints and suite are the plan's; a row stopped by bad
input is named, with why, instead of vanishing."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from evidence_records import H200_ROW

from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.evidence import fingerprint, manifest
from mtpmatrix.core.rows import load_rows
from mtpmatrix.runner import matrix, plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rows(tmp_path):
    folder = tmp_path / "constraints"
    folder.mkdir()
    for name in ("sglang-0.5.17.txt", "sglang-0.5.23.txt"):
        shutil.copy(REPO / "constraints" / name, folder / name)
    return folder


def _rows(folder):
    return {r.id: r for r in load_rows(folder)}


def _opts(tmp_path, **kw):
    return matrix.Options(run_id="run1", results=tmp_path / "results", **kw)


def _finish(opts, row_id, suite=None):
    atomic_write_json(
        Path(opts.results) / opts.run_id / row_id / "row.json",
        {"row": {"id": row_id}, "verdict": "passed", "fingerprint": suite or fingerprint.describe()},
    )


def test_the_first_row_writes_the_plan_of_every_queued_row(tmp_path, rows):
    table = _rows(rows)
    opts = _opts(tmp_path, tiers="contract")
    assert plan.start(opts, "sglang-0.5.17", plan.planned(table, list(table))) is None
    m = manifest.read(tmp_path / "results" / "run1")
    assert sorted(m["rows"]) == ["sglang-0.5.17", "sglang-0.5.23"]
    assert m["rows"]["sglang-0.5.17"]["pins"]["sglang"] == "0.5.17"
    assert m["fingerprint"]["suite"] == fingerprint.describe()["suite"] and m["invocation"]["tiers"] == "contract"


def test_resume_keeps_a_finished_row_only_while_its_constraints_are_the_plans(tmp_path, rows):
    table = _rows(rows)
    opts = _opts(tmp_path)
    plan.start(opts, "sglang-0.5.17", plan.planned(table, list(table)))
    _finish(opts, "sglang-0.5.17")
    resumed = _opts(tmp_path, resume=True)
    assert "already has a verdict" in plan.start(resumed, "sglang-0.5.17", plan.planned(table, list(table)))
    # the constraints file changes: the finished row runs again with the new pins, and the plan says so
    f = rows / "sglang-0.5.17.txt"
    f.write_text(f.read_text().replace("transformers==5.12.1", "transformers==5.13.0"))
    table = _rows(rows)
    assert plan.start(resumed, "sglang-0.5.17", plan.planned(table, list(table))) is None
    assert manifest.read(tmp_path / "results" / "run1")["rows"]["sglang-0.5.17"]["pins"]["transformers"] == "5.13.0"


def test_resume_runs_again_a_row_another_suite_wrote(tmp_path, rows):
    table = _rows(rows)
    opts = _opts(tmp_path)
    plan.start(opts, "sglang-0.5.17", plan.planned(table, list(table)))
    _finish(opts, "sglang-0.5.17", suite={"suite": "0" * 64})
    assert plan.start(_opts(tmp_path, resume=True), "sglang-0.5.17", plan.planned(table, list(table))) is None


def test_a_row_stopped_by_bad_input_is_named_and_cleared_when_it_runs(tmp_path, rows):
    table = _rows(rows)
    opts = _opts(tmp_path)
    plan.start(opts, "sglang-0.5.17", plan.planned(table, list(table)))
    plan.not_run(opts, "sglang-0.5.23", "--with transformers==9.9: no such release")
    assert manifest.read(tmp_path / "results" / "run1")["not_run"] == {
        "sglang-0.5.23": "--with transformers==9.9: no such release"
    }
    plan.start(opts, "sglang-0.5.23", plan.planned(table, list(table)))
    assert manifest.read(tmp_path / "results" / "run1")["not_run"] == {}


def test_the_queued_rows_come_from_nox_and_else_every_row():
    def queued(row):
        return SimpleNamespace(name="gemma4_mtp", func=SimpleNamespace(call_spec={"row": row}))

    runner = SimpleNamespace(
        name="gemma4_mtp",
        manifest=SimpleNamespace(
            _consumed=[queued("a")], _queue=[queued("b"), SimpleNamespace(name="unit", func=SimpleNamespace())]
        ),
    )
    assert plan.queued_rows(SimpleNamespace(_runner=runner), ["a", "b", "c"]) == ["a", "b"]
    assert plan.queued_rows(SimpleNamespace(), ["a", "b", "c"]) == ["a", "b", "c"]


def test_a_pipeline_plan_names_the_rows_whose_job_never_uploaded(tmp_path, h200_run):
    """The CI workflow plans the run first (python -m mtpmatrix plan), each row job's manifest is renamed
    manifest-<row>.json, and the report reads them merged: a row planned by the pipeline with no record is not run."""
    from mtpmatrix.__main__ import main
    from mtpmatrix.report import summary as report_summary

    results, run = h200_run
    (run / "manifest.json").rename(run / f"manifest-{H200_ROW}.json")
    assert main(["plan", run.name, "--rows", f"{H200_ROW},sglang-0.5.23", "--results", str(results)]) == 0
    s = report_summary.build_summary(run, require=["smoke"])
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN and s["evidence"]["run"] == []
    assert s["evidence"]["rows"]["sglang-0.5.23"][0]["what"] == "not run: no record: the row's session never wrote one"
    assert H200_ROW not in s["evidence"]["rows"]


def test_plans_that_disagree_are_not_proven(tmp_path, h200_run):
    from mtpmatrix.report import summary as report_summary

    results, run = h200_run
    other = manifest.read(run)
    other["fingerprint"] = {"suite": "2" * 64}
    atomic_write_json(run / "manifest-other.json", other)
    s = report_summary.build_summary(run, require=["smoke"])
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN
    assert s["evidence"]["run"][0].startswith("the run's plans disagree: manifest-other.json plans suite 222222222222")


def test_a_bad_row_list_is_one_line(tmp_path, capsys):
    from mtpmatrix.__main__ import main

    assert main(["plan", "r", "--rows", "sglang-9", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --rows: unknown row(s) sglang-9; known: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--with", "transformers"], "--with 'transformers': give a version"),
        (["--tiers", "contract,gpu"], "--tiers 'contract,gpu': known tiers are"),
    ],
)
def test_a_plan_refuses_what_its_row_jobs_would(tmp_path, capsys, argv, words):
    from mtpmatrix.__main__ import main

    """A --with spec or tier the row jobs refuse is refused by the plan too, in one line, nothing written (a new user's
    walk, 2026-12-05c: the plan took `--with transformers` with exit 0, every job then failing on it)."""
    assert main(["plan", "r", "--rows", "sglang-0.5.17", *argv, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
