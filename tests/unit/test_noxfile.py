"""noxfile.py: nox lists every row (with its tags) and a malformed constraints/ fails nox in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.core.rows import load_rows

# this interpreter's nox, else the one on PATH (inside `nox -s unit` the venv has no nox, the machine does)
NOX = (
    [sys.executable, "-m", "nox"]
    if importlib.util.find_spec("nox")
    else [shutil.which("nox")]
    if shutil.which("nox")
    else None
)
if NOX is None:
    pytest.skip("nox is not installed here (pip install -e '.[dev]')", allow_module_level=True)
pytestmark = pytest.mark.nox  # every test here launches nox

REPO = Path(__file__).resolve().parents[2]
ROWS = load_rows(REPO / "constraints")


def nox(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MTPMATRIX_", "NOX"))}
    return subprocess.run([*NOX, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def listing(*args: str) -> list[dict]:
    proc = nox("-l", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_list_json_has_every_default_row_with_its_tags():
    got = {s["session"]: s for s in listing()}
    want = [r for r in ROWS if r.default]
    assert want, "no default rows"
    assert set(got) == {f"gemma4_mtp({r.id})" for r in want}  # default sessions are the default rows, nothing else
    for r in want:
        s = got[f"gemma4_mtp({r.id})"]
        assert s["name"] == "gemma4_mtp"
        assert s["call_spec"] == {"row": r.id}
        assert s["tags"] == [t for t in r.tags if t != "ci"]  # 'ci' selects the ci_row session instead
        assert s["python"] == r.python


def test_extra_session_has_the_non_default_rows():
    got = {s["call_spec"]["row"]: s for s in listing("-s", "gemma4_mtp_extra")}
    assert set(got) == {r.id for r in ROWS if not r.default}
    for r in ROWS:
        if not r.default:
            assert got[r.id]["tags"] == list(r.tags) and got[r.id]["python"] == r.python


def test_ci_tag_is_unit_lint_typecheck_and_the_ci_rows_filed_apart_from_the_matrix():
    """`nox -t ci` runs the ci rows through ci_row (results/ci-<time>/), never the matrix sessions themselves: after
    `nox -s gemma4_mtp` and then `nox -t ci`, the report's default run is still the matrix."""
    got = {s["session"] for s in listing("-t", "ci")}
    ci_rows = {f"ci_row({r.id})" for r in ROWS if "ci" in r.tags}
    assert ci_rows, "no row is tagged ci"
    assert got == {"unit", "lint", "typecheck"} | ci_rows


def copy_project(tmp_path: Path) -> Path:
    dst = tmp_path / "proj"
    dst.mkdir()
    shutil.copy2(REPO / "noxfile.py", dst / "noxfile.py")
    shutil.copytree(REPO / "src", dst / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(REPO / "constraints", dst / "constraints")
    return dst


@pytest.mark.parametrize(
    "name,text,line,words",
    [
        (
            "sglang-9.9.9.txt",
            "# python: 3.11\n# torch-backend: pypi\n# gpu: 2\nsglang==9.9.9\ntransformers==5.12.1\ntorch==2.11.0\n",
            3,
            "unknown header key 'gpu'",
        ),
        (
            "sglang-9.9.9.txt",
            "# python: 3.11\n# torch-backend: pypi\nsglang==9.9.9\ntransformers>=5.12\ntorch==2.11.0\n",
            4,
            "must be pinned exactly",
        ),
        (
            "sglang-0.5.13.txt",
            "# python: 3.11\n# torch-backend: pypi\nsglang==0.5.13\ntransformers==5.7.0\ntorch==2.11.0\n",
            4,
            "predates gemma4_assistant",
        ),
    ],
)
def test_malformed_constraints_fail_nox_in_one_line(tmp_path, name, text, line, words):
    proj = copy_project(tmp_path)
    bad = proj / "constraints" / name
    bad.write_text(text)
    for args in (["-l"], ["-l", "--json"], ["-s", "gemma4_mtp"]):
        proc = nox(*args, cwd=proj)
        assert proc.returncode != 0
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"error: {bad}:{line}: ") and words in lines[0], lines[0]
    assert not (proj / ".nox").exists()  # failed before any venv was made


def test_copied_project_with_good_rows_lists_them(tmp_path):
    """The copy used above is a working project: only the bad file makes it fail."""
    proc = nox("-l", "--json", cwd=copy_project(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == sum(r.default for r in ROWS)


NOT_PROVEN_RUN, BROKEN_RUN = "20261209-140233", "20261208-090507"  # data/runs: exit 3 and exit 1 of the report


def test_report_session_passes_not_proven_and_fails_it_as_a_gate(results):
    """`nox -s report` prints NOT PROVEN as the answer it is and succeeds; --gate and --require make exit 3 fail
    the session (a pipeline's gate); a broken row fails it always. The recorded runs, their verdicts known."""

    def report(*args: str) -> subprocess.CompletedProcess:
        # -R after the first: the session's venv (-e . and jinja2) is made once; a hang bound only
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MTPMATRIX_", "NOX"))}
        cmd = [*NOX, "-R", "-s", "report", "--", *args, "--results", str(results), "--out", str(results / "out")]
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    answer = report(NOT_PROVEN_RUN)
    assert answer.returncode == 0, answer.stdout[-3000:] + answer.stderr[-3000:]
    assert answer.stdout.startswith("❔ NOT PROVEN — ") and "Session report was successful" in answer.stderr
    for gate in (["--gate"], ["--require", "contract"], ["--require=contract,reference"]):
        proc = report(NOT_PROVEN_RUN, *gate)
        assert proc.returncode != 0 and "NOT PROVEN" in proc.stdout, (gate, proc.stderr[-2000:])
        assert "failed with exit code 3" in proc.stderr and "Session report failed" in proc.stderr, gate
    broken = report(BROKEN_RUN)
    assert broken.returncode != 0 and broken.stdout.startswith("❌ DOES NOT QUALIFY")
    assert "failed with exit code 1" in broken.stderr
