"""What a report says was proven: verdict words, --require, exit statuses, known-upstream failures beside the row
(on runs made in tmp), and the report's own dependency (jinja2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from evidence_records import stamp

from mtpmatrix.__main__ import main
from mtpmatrix.core import store
from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.core.evidence import expected_checks
from mtpmatrix.core.schema import TIERS
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary

BASE, CUR = "20261201-090512", "20261208-090507"  # the hand-made runs of test_report.py


def _row(summary, rid):
    return next(r for r in summary["rows"] if r["id"] == rid)


# --- what was proven: verdict words, --require, exit statuses ------------------------------------------------------

GPU_SKIP = "smoke tier: needs 1 CUDA GPU(s), this machine has 0"


def _tier(verdict, reason=None, checks=None):
    t = {
        "verdict": verdict,
        "checks": checks
        if checks is not None
        else [
            {
                "id": f"tests/tiers/test_x.py::test_{verdict}",
                "tier": "x",
                "outcome": verdict,
                "seconds": 1.0,
                "metrics": {},
            }
        ],
    }
    if reason:
        t["reason"] = reason
    return t


def _filed(tier: str, entry: dict) -> dict:
    """Every made-up check filed under its tier, in a file of its tier (a check id appears once in a row)."""
    return dict(
        entry,
        checks=[
            dict(c, tier=tier, id=c["id"].replace("test_x.py", f"test_x_{tier}.py")) for c in entry.get("checks") or []
        ],
    )


def _run(root, run_id, rows, versions=None, gpus=None):
    for rid, tiers in rows.items():
        d = root / run_id / rid
        d.mkdir(parents=True)
        tiers = {t: _filed(t, tv) for t, tv in tiers.items()}
        rec = {
            "row": {"id": rid, "pins": {}},
            "install": {"verdict": "passed"},
            "tiers": tiers,
            # a session that collected exactly what it recorded: nothing deselected, no knobs
            "selection": {
                "args": ["tests/tiers"],
                "paths": ["tests/tiers"],
                "knobs": {},
                "collected": {t: [c["id"] for c in tv.get("checks") or []] for t, tv in tiers.items()},
            },
            "versions": dict(versions or {}),
            **({"gpus": gpus[rid]} if rid in (gpus or {}) else {}),
        }
        rec["verdict"] = store.row_verdict(rec)
        (d / "row.json").write_text(json.dumps(rec))
    stamp(root / run_id, complete_cpu_tiers=True)  # the manifest, the fingerprint, tiers.json, junit.xml
    return root


def _cpu_tiers(reference=None):
    return {
        "contract": _tier("passed"),
        "reference": reference or _tier("passed"),
        "smoke": _tier("skipped", GPU_SKIP, []),
        "gsm8k": _tier("skipped", GPU_SKIP.replace("smoke", "gsm8k"), []),
    }


def test_cpu_only_run_says_what_ran_and_a_release_gate_can_demand_the_gpu_tiers(tmp_path, capsys):
    _run(tmp_path, "20260101-000000", {"a": _cpu_tiers(), "b": _cpu_tiers()})
    args = ["report", "--results", str(tmp_path)]
    # without --require the question is the release: not proven (exit 3), saying what did pass
    assert main(args) == report_summary.EXIT_NOT_PROVEN
    out = capsys.readouterr().out
    assert "NOT PROVEN — CPU checks pass; smoke and gsm8k not run (no GPU)" in out and "QUALIFIES" not in out
    s = json.loads((tmp_path / "20260101-000000" / "report" / "summary.json").read_text())
    assert (s["verdict"], s["qualifies"], s["exit_status"]) == ("not-proven", False, 3)
    assert main(args + ["--require", "smoke,gsm8k"]) == report_summary.EXIT_NOT_PROVEN
    assert "NOT PROVEN — smoke: not run in a, b (no GPU) | gsm8k: not run in a, b (no GPU)" in capsys.readouterr().out
    # a gate that asks for the CPU tiers only gets exit 0, and the headline says it is no release qualification
    assert main(args + ["--require", "contract,reference"]) == report_summary.EXIT_OK
    out = capsys.readouterr().out
    assert "contract and reference proven in all 2 rows (a: " in out and ", not a release qualification: " in out
    assert main(args + ["--require", "smoke,gpu"]) == report_summary.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == "error: --require: unknown tier(s) gpu; known: contract, reference, smoke, gsm8k\n"


def test_only_every_tier_in_every_row_qualifies(tmp_path, results):
    # the baseline ran every tier, but its GPU tiers only in part (the old gate called that QUALIFIES)
    assert (
        main(["report", BASE, "--results", str(results), "--require", "smoke,gsm8k"]) == report_summary.EXIT_NOT_PROVEN
    )
    s = json.loads((results / BASE / "report" / "summary.json").read_text())
    assert s["verdict"] == "not-proven" and "QUALIFIES" not in report_render.render_markdown(s)
    # one row without a GPU: smoke and gsm8k ran (in part) in the other row only, on a box with two
    _run(
        tmp_path, "20260101-000000", {"gpu": {t: _tier("passed") for t in TIERS}, "cpu": _cpu_tiers()}, gpus={"gpu": 2}
    )
    s = report_summary.build_summary(tmp_path / "20260101-000000", require=["gsm8k"])
    assert s["verdict"] == "not-proven" and s["exit_status"] == report_summary.EXIT_NOT_PROVEN
    md = report_render.render_markdown(s)
    assert "gsm8k: not run in cpu (no GPU); partial in gpu (not run or short: " in md


def test_a_failure_beats_a_missing_tier_and_nothing_run_proves_nothing(tmp_path):
    _run(tmp_path, "r1", {"a": _cpu_tiers(reference=_tier("failed"))})
    s = report_summary.build_summary(tmp_path / "r1", require=["smoke"])
    assert (s["verdict"], s["exit_status"]) == ("fails", report_summary.EXIT_FAILED)
    _run(tmp_path, "r2", {"a": {t: _tier("skipped", "not selected", []) for t in TIERS}})
    s = report_summary.build_summary(tmp_path / "r2")
    assert (s["verdict"], s["exit_status"]) == ("not-proven", report_summary.EXIT_NOT_PROVEN)


def test_known_upstream_failures_show_next_to_the_row_and_do_not_fail_it(tmp_path):
    from mtpmatrix.core import known_upstream

    rec = read_json_or_gzip(
        Path(__file__).resolve().parents[2] / "docs" / "runs" / "cpu-20261130-matrix1-sglang-0.5.23.json.gz"
    )
    known_upstream.apply(rec["tiers"], rec["versions"])
    for tier in ("contract", "reference"):  # the checks today's suite has that the recorded run did not: passed
        have = {c["id"] for c in rec["tiers"][tier]["checks"]}
        rec["tiers"][tier]["checks"] += [
            {"id": i, "tier": tier, "outcome": "passed", "seconds": 0.1, "metrics": {}}
            for i in expected_checks.load()[tier]
            if i not in have
        ]
    ok = json.loads(json.dumps(rec["tiers"]))
    ok["reference"] = _tier("passed")
    # the report derives the tags again from the checks and the row's versions (a stored tag is never trusted)
    _run(tmp_path, "20260101-000000", {"sglang-0.5.23": ok}, rec["versions"])
    _run(tmp_path, "20260102-000000", {"sglang-0.5.23": rec["tiers"], "sglang-0.5.17": _cpu_tiers()}, rec["versions"])
    s = report_summary.build_summary(tmp_path / "20260102-000000", baseline_dir=tmp_path / "20260101-000000")
    # the recorded CPU run's contract tier predates checks the suite has now (partial); reference is known upstream
    assert s["row_verdicts"]["sglang-0.5.23"] == "passed" and not s["failing_rows"]
    row = _row(s, "sglang-0.5.23")
    assert row["tiers"]["reference"]["failures"] == []  # not listed as a failure ...
    md = report_render.render_markdown(s)
    assert "## Failures" not in md
    assert "⚠️ known-upstream" in md and "**Known upstream**" in md  # ... but next to the row, with its link
    assert "https://github.com/huggingface/transformers/pull/48982" in md and "fixed in 5.20.0" in md
    assert "1 library bug(s), not sglang: sglang-0.5.23 reference" in md
    assert s["baseline"]["new_failures"] == []  # an upgrade that hits a known upstream bug is no regression
    html = report_render.render_html(s)
    assert 'class="v known-upstream"' in html and "pull/48982" in html


# --- jinja2 is the report's own dependency ------------------------------------------------------------------------


def test_without_jinja2_the_report_says_what_to_install_in_one_line(results, capsys, monkeypatch):
    from mtpmatrix.report import render

    monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` raises ImportError
    render.environment.cache_clear()
    try:
        assert main(["report", CUR, "--results", str(results)]) == report_summary.EXIT_BAD_INPUT
    finally:
        render.environment.cache_clear()
    assert capsys.readouterr().err == "error: the report needs jinja2: pip install jinja2 (nox -s report installs it)\n"
    assert not (results / CUR / "report").exists()  # nothing half-written


def test_the_package_imports_without_jinja2():
    """Row venvs get the package but not jinja2: `python -m mtpmatrix rows|mutants|bisect` must not need it."""
    src = Path(__file__).resolve().parents[2] / "src"
    code = "import sys; sys.modules['jinja2'] = None; import mtpmatrix.report.cli, mtpmatrix.report.summary, mtpmatrix.__main__; print('ok')"
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}
    )
    assert got.stdout == "ok\n", got.stderr


@pytest.mark.parametrize(
    "message, state",
    [
        ("index unreachable: error: Failed to fetch: `https://download.pytorch.org/whl/cu130/torch/`", "not-proven"),
        ("resolver conflict: x No solution found when resolving dependencies", "failed"),
    ],
)
def test_a_row_the_machine_could_not_install_is_not_proven_not_failed(results, tmp_path, capsys, message, state):
    """The hand-made cu130 row that did not install, its failure once a resolver conflict (the row's packages: DOES NOT
    QUALIFY, exit 1) and once an index that did not answer (the machine's: NOT PROVEN, exit 3; a new user's walk,
    2026-12-05c, saw 'DOES NOT QUALIFY' for it)."""
    import shutil

    run = tmp_path / "runs" / CUR  # the row's own run id: filed elsewhere, it would be not proven for that
    shutil.copytree(results / CUR / "sglang-0.5.23-cu130", run / "sglang-0.5.23-cu130")
    record = json.loads((run / "sglang-0.5.23-cu130" / "row.json").read_text())
    record["install"]["failure"]["message"] = message
    record.pop("verdict", None)
    (run / "sglang-0.5.23-cu130" / "row.json").write_text(json.dumps(record))
    s = report_summary.build_summary(run)
    assert _row(s, "sglang-0.5.23-cu130")["state"] == state
    rc = main(["report", CUR, "--results", str(tmp_path / "runs")])
    assert rc == (report_summary.EXIT_NOT_PROVEN if state == "not-proven" else report_summary.EXIT_FAILED)
    assert f"install failed: {message.split(':')[0]}" in capsys.readouterr().out
