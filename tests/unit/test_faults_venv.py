"""The mutants session's row venv (faults/venv.py): --row, the install commands and environment, and the session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.core.rows import load_rows
from mtpmatrix.faults import venv as V
from mtpmatrix.faults.mutation import MutantsError
from mtpmatrix.runner import matrix

REPO = Path(__file__).resolve().parents[2]


def test_split_row_arg():
    assert V.split_row_arg(["--row", "sglang-0.5.17", "--check"]) == ("sglang-0.5.17", ["--check"])
    assert V.split_row_arg(["--row=x", "--mutants", "a"]) == ("x", ["--mutants", "a"])
    assert V.split_row_arg([]) == (None, [])
    with pytest.raises(MutantsError):
        V.split_row_arg(["--row"])


def test_prepare_builds_the_ci_row_with_the_matrix_install(tmp_path):
    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    ci = next(r for r in rows.values() if "ci" in r.tags)
    got = V.prepare(rows, ["--check"], tmp_path, environ={"PATH": "/usr/bin", "PYTHONPATH": "src", "HOME": "/h"})
    assert got.row_id == ci.id and got.venv == tmp_path / f"mutants-{ci.id}"
    constraints = tmp_path / f"mutants-{ci.id}.constraints.txt"
    assert constraints.read_text() == matrix.constraints_text(ci, [])
    assert got.commands[0][1:] == ["venv", "--python", ci.python, str(got.venv)]  # no venv yet
    assert got.commands[1] == matrix.install_command(ci, got.venv, constraints, None)
    python = matrix.venv_python(got.venv)
    assert got.mutants == [str(python), "-m", "mtpmatrix", "mutants", "--check"]
    assert "PYTHONPATH" not in got.env and got.env["HOME"] == "/h" and got.env["VIRTUAL_ENV"] == str(got.venv)
    assert got.env["PATH"] == f"{python.parent}{os.pathsep}/usr/bin"


def test_prepare_refuses_an_unknown_row_in_one_line(tmp_path):
    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    with pytest.raises(MutantsError, match=r"^unknown row 'nope'; known: sglang-0.5.13"):
        V.prepare(rows, ["--row", "nope"], tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.nox
def test_nox_mutants_session_rejects_an_unknown_row_in_one_line():
    import importlib.util

    nox = (
        [sys.executable, "-m", "nox"]
        if importlib.util.find_spec("nox")
        else ([shutil.which("nox")] if shutil.which("nox") else None)
    )
    if nox is None:
        pytest.skip("nox is not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MTPMATRIX_", "NOX"))}
    proc = subprocess.run(
        [*nox, "-s", "mutants", "--", "--row", "nope"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "unknown row 'nope'; known: sglang-0.5.13" in proc.stderr
