"""mtpmatrix.tiers.session.process: a pytest run through it ends as ``python -m pytest`` does (exit status, junit.xml,
the plugin's results, atexit handlers, non-daemon threads, flushed output) and skips only the interpreter's teardown
(a module's ``__del__`` at teardown never runs); its GC thresholds are in force while the tests run."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mtpmatrix.tiers.session import process as pytest_process

SRC = Path(__file__).resolve().parents[2] / "src"

SUITE = """
import atexit, gc, os, threading, time

def _at_exit():
    print("ATEXIT ran", flush=True)

atexit.register(_at_exit)

class Teardown:  # alive until the interpreter frees this module's globals
    def __del__(self, write=os.write):  # bound now: at teardown the module's globals are gone
        write(1, b"TEARDOWN ran\\n")

KEEP = Teardown()

def _late():
    time.sleep(0.2)
    print("THREAD finished", flush=True)

def test_thresholds(record_property):
    record_property("thresholds", list(gc.get_threshold()))
    threading.Thread(target=_late).start()  # non-daemon: a normal exit waits for it

def test_outcome():
    assert OUTCOME
"""


def _run(tmp_path: Path, launcher: str, outcome: str) -> tuple[subprocess.CompletedProcess, dict]:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "test_x.py").write_text(SUITE.replace("OUTCOME", outcome))
    results = tmp_path / f"tiers-{launcher}.json"
    junit = tmp_path / f"junit-{launcher}.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            launcher,
            str(suite),
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "mtpmatrix.tiers.session.plugin",
            f"--mtp-results={results}",
            f"--junitxml={junit}",
        ],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert junit.is_file() and results.is_file(), done.stdout + done.stderr  # both written at sessionfinish
    json.loads(results.read_text())
    cases = {}  # test name -> (outcome, properties) from pytest's own junit.xml
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None else "passed"
        cases[case.get("name")] = (outcome, {p.get("name"): p.get("value") for p in case.iter("property")})
    return done, cases


@pytest.mark.parametrize("outcome,status", [("True", 0), ("False", 1)])
def test_ends_as_pytest_does_without_the_teardown(tmp_path, outcome, status):
    plain, plain_results = _run(tmp_path, "pytest", outcome)
    quick, quick_results = _run(tmp_path, "mtpmatrix.tiers.session.process", outcome)
    assert plain.returncode == quick.returncode == status
    for out in (plain.stdout, quick.stdout):  # the summary line, the thread's and atexit's output, in that order
        assert ("1 passed" if status else "2 passed") in out
        assert out.index("THREAD finished") < out.index("ATEXIT ran")
    assert "TEARDOWN ran" in plain.stdout and "TEARDOWN ran" not in quick.stdout
    assert {k: v[0] for k, v in quick_results.items()} == {k: v[0] for k, v in plain_results.items()}
    assert quick_results["test_thresholds"][1]["thresholds"] == str(list(pytest_process.GC_THRESHOLDS))
    assert plain_results["test_thresholds"][1]["thresholds"] == str(list(gc.get_threshold()))  # CPython's default


def test_nothing_collected_keeps_pytests_status(tmp_path):
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtpmatrix.tiers.session.process",
            str(tmp_path / "empty"),
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 5, done.stdout + done.stderr
