"""Every marker the suite uses is registered: collection under --strict-markers works, in the repository and with
the plugin alone (a GPU box's plain pytest outside this checkout's pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.core.kinds import KINDS
from mtpmatrix.core.paths import SUITE
from mtpmatrix.core.schema import TIERS

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", [SUITE, "tests/unit"])
def test_suite_collects_with_strict_markers(folder):
    """Each folder on its own, as the runner and `nox -s unit` collect them (their test_smoke.py share a name)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--strict-markers", "-p", "no:cacheprovider", folder],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_plugin_registers_the_suites_markers_without_an_ini(pytester):
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")  # no markers of its own
    pytester.makeconftest('pytest_plugins = ["mtpmatrix.tiers.session.plugin"]\n')
    pytester.makepyfile(
        test_marks="""
import pytest

@pytest.mark.contract
@pytest.mark.check("config")
def test_a():
    pass

@pytest.mark.reference
@pytest.mark.shared_reference
def test_b():
    pass

@pytest.mark.smoke
def test_c():
    pass

@pytest.mark.gsm8k
def test_d():
    pass
"""
    )
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    markers = pytester.runpytest("--markers").stdout.str()
    for tier in TIERS:
        assert f"@pytest.mark.{tier}:" in markers
    # the check(kind) marker names every kind kinds.KINDS has, from KINDS itself
    check_line = next(ln for ln in markers.splitlines() if ln.startswith("@pytest.mark.check(kind)"))
    assert all(kind in check_line for kind in KINDS)


def test_an_unregistered_marker_is_refused(pytester):
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makeconftest('pytest_plugins = ["mtpmatrix.tiers.session.plugin"]\n')
    pytester.makepyfile(test_typo="import pytest\n\n@pytest.mark.smokee\ndef test_a():\n    pass\n")
    assert pytester.runpytest("--collect-only", "-q").ret != 0
