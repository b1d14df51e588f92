"""The package as a wheel: built from this tree (uv build, the build backend of pyproject.toml), it holds every file
under src/mtpmatrix, and installed into a fresh venv it reports a recorded run as the checkout does.

Package data is not listed by hand (MANIFEST.in grafts the package folder): a file the code reads (the expected
checks, the known-upstream list, the report's templates, the GSM8K split, the mutant hook) is in the wheel by living
there. Building copies the tree first: setuptools writes build/ and *.egg-info next to what it builds, and a stale
build/lib would hide a file the configuration leaves out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "mtpmatrix"
# what the build reads: the configuration, the readme it embeds, and the package (its __pycache__ folders too, which
# the wheel must leave out)
BUILD_INPUTS = ("pyproject.toml", "MANIFEST.in", "README.md")
BROKEN_RUN = "20261208-090507"  # data/runs: sglang-0.5.13 broke (exit 1), the same words from wheel and checkout


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("NOX")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def _uv() -> str:
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (pip install nox uv)"
    return uv


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for name in BUILD_INPUTS:
        shutil.copy2(REPO / name, tree / name)
    shutil.copytree(PACKAGE, tree / "src" / "mtpmatrix")
    dist = tree / "dist"
    proc = subprocess.run(
        [_uv(), "build", "--wheel", "--python", sys.executable, "--out-dir", str(dist), str(tree)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = dist.glob("*.whl")
    return built


def source_files() -> set[str]:
    """Every file of the package in this tree, as the wheel names it (bytecode caches aside)."""
    return {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


def test_wheel_holds_every_file_of_the_package_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as z:
        packaged = {n for n in z.namelist() if n.startswith("mtpmatrix/")}
    source = source_files()
    assert {n for n in source if not n.endswith(".py")} >= {
        "mtpmatrix/core/expected_checks.json",  # the report's yardstick: the one the issue found missing
        "mtpmatrix/core/known_upstream.json",
    }
    assert not source - packaged, f"in src/mtpmatrix, not in the wheel: {sorted(source - packaged)}"
    assert not packaged - source, f"in the wheel, not in src/mtpmatrix: {sorted(packaged - source)}"


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its 'report' extra (dependencies from uv's cache or the index): its python."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    for cmd in (
        [_uv(), "venv", "-q", "--python", sys.executable, str(venv)],
        [_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"{wheel}[report]"],
    ):
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return venv / "bin" / "python"


def run_installed(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # -I: nothing of the checkout (cwd, PYTHONPATH, user site) on the path, only what the venv installed
    return subprocess.run([str(python), "-I", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def test_installed_wheel_runs_every_command_and_reports_as_the_checkout(installed, results, tmp_path):
    where = run_installed(installed, "-c", "import mtpmatrix; print(mtpmatrix.__file__)", cwd=tmp_path)
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(installed.parents[1]), where
    usage = run_installed(installed, "-m", "mtpmatrix", "--help", cwd=tmp_path)
    commands = re.search(r"\{([a-z,]+)\}", usage.stdout)
    assert usage.returncode == 0 and commands, usage.stderr
    for command in commands.group(1).split(","):
        proc = run_installed(installed, "-m", "mtpmatrix", command, "--help", cwd=tmp_path)
        assert proc.returncode == 0, f"{command} --help: {proc.stderr[-2000:]}"
    # the report reads the expected checks, the known-upstream list and the templates from the installed package
    args = ["-m", "mtpmatrix", "report", BROKEN_RUN, "--results", str(results)]
    from_wheel = run_installed(installed, *args, "--out", str(tmp_path / "wheel"), cwd=tmp_path)
    from_checkout = subprocess.run(
        [sys.executable, *args, "--out", str(tmp_path / "checkout")],
        cwd=REPO,
        env={**_env(), "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert from_checkout.returncode == 1, from_checkout.stderr  # DOES NOT QUALIFY: sglang-0.5.13 broke
    assert from_wheel.returncode == from_checkout.returncode, from_wheel.stderr[-3000:]
    assert from_wheel.stderr == "" and "Traceback" not in from_wheel.stdout
    # the verdict and each row's line alike (the headline's provenance differs: only a checkout has a commit)
    (headline, *rows), (wheel_headline, *wheel_rows) = (
        p.stdout.split("\nreport: ")[0].splitlines() for p in (from_checkout, from_wheel)
    )
    assert headline.startswith("❌ DOES NOT QUALIFY — ") and wheel_headline.startswith("❌ DOES NOT QUALIFY — ")
    assert rows and wheel_rows == rows
    for name in ("summary.md", "report.html", "summary.json"):
        assert (tmp_path / "wheel" / name).stat().st_size > 0


def test_an_installed_wheel_vouches_for_its_files_by_its_record(installed, results, tmp_path):
    """No git beside an installed package: its distribution's RECORD (a sha256 per file) holds the verdict-deciding
    files it installed (evidence/checkout.py); one edited in site-packages is named, and the run is not proven."""
    args = ["-m", "mtpmatrix", "report", BROKEN_RUN, "--results", str(results)]
    clean = run_installed(installed, *args, "--out", str(tmp_path / "clean"), cwd=tmp_path)
    headline = clean.stdout.splitlines()[0]
    assert "judged by the installed gemma4-mtp-matrix " in headline and "against its RECORD" in headline, headline
    assert "not vouched for" not in headline and "differ from" not in headline
    where = run_installed(installed, "-c", "import mtpmatrix; print(mtpmatrix.__file__)", cwd=tmp_path)
    listed = Path(where.stdout.strip()).parent / "core" / "known_upstream.json"
    original = listed.read_bytes()
    try:
        listed.write_bytes(original + b"\n")  # an excuse edited where the wheel put it
        edited = run_installed(installed, *args, "--out", str(tmp_path / "edited"), cwd=tmp_path)
    finally:
        listed.write_bytes(original)
    edited_headline = edited.stdout.splitlines()[0]
    assert "against its RECORD, whose mtpmatrix/core/known_upstream.json differ from it" in edited_headline, (
        edited_headline
    )
    summary = json.loads((tmp_path / "edited" / "summary.json").read_text())
    assert any("differ from its RECORD" in p for p in summary["evidence"]["run"])
    judge = Path(where.stdout.strip()).parent / "report" / "summary.py"  # the judge's own code, never run on a box
    original = judge.read_bytes()
    try:
        judge.write_bytes(original + b"\n")
        rejudged = run_installed(installed, *args, "--out", str(tmp_path / "judge"), cwd=tmp_path)
    finally:
        judge.write_bytes(original)
    assert "whose mtpmatrix/report/summary.py differ from it" in rejudged.stdout.splitlines()[0], rejudged.stdout
