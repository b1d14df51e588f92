"""tools/gpu_box.sh: every run starts from a clean output folder and is bound to its evidence by a fresh
invocation id, so a pytest that writes nothing (a usage error, the kill after GPU_BOX_TIMEOUT, an OOM) never leaves an
earlier run's tiers.json to be imported under the new run's invocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.__main__ import main
from mtpmatrix.core import schema
from mtpmatrix.core.atomic import atomic_write_json, read_json_or_gzip

REPO = Path(__file__).resolve().parents[2]
BOX_RUN = REPO / "docs" / "runs" / "2026-11-30-h200-sglang-0.5.17-smoke-gsm8k-tiny.json.gz"
# everything gpu_box.sh writes into OUT (the work folder is its scratch space)
BOX_FILES = (
    schema.TIERS_FILE,
    schema.JUNIT_FILE,
    schema.PYTEST_LOG,
    schema.ENV_FILE,
    schema.INVOCATION_FILE,
    "logs.tgz",
)


def run_gpu_box(out: Path, *pytest_args: str) -> subprocess.CompletedProcess:
    """gpu_box.sh with this interpreter as its python3 (it has the test dependencies), no GPU, no bundle."""
    env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE", "SITE", "TESTS", "GPU_BOX_TIMEOUT")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(REPO / "tools" / "gpu_box.sh"), str(out), *pytest_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def stale_out(tmp_path) -> Path:
    """An OUT folder holding an earlier run's every file (a whole, passing tiers.json among them), and a work folder
    a killed run left with its tiers.json in it."""
    out = tmp_path / "box"
    out.mkdir()
    for name in BOX_FILES:
        (out / name).write_text("stale\n")
    atomic_write_json(out / schema.TIERS_FILE, read_json_or_gzip(BOX_RUN))
    (out / "work").mkdir()
    atomic_write_json(out / "work" / schema.TIERS_FILE, read_json_or_gzip(BOX_RUN))
    return out


def test_a_pytest_usage_error_leaves_no_earlier_evidence_and_import_refuses(stale_out, tmp_path, capsys):
    proc = run_gpu_box(stale_out, "--no-such-option")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # pytest's usage error, passed on
    left = {p.name for p in stale_out.iterdir()}
    assert schema.TIERS_FILE not in left and schema.JUNIT_FILE not in left and "work" not in left
    for name in left:  # what is there was written by this run
        assert (stale_out / name).read_bytes() != b"stale\n", name
    assert "--no-such-option" in (stale_out / schema.PYTEST_LOG).read_text()
    invocation = json.loads((stale_out / schema.INVOCATION_FILE).read_text())
    assert len(invocation["invocation_id"]) == 32 and invocation["started"].endswith("Z")
    assert invocation["pytest_args"] == ["--no-such-option"]

    results = tmp_path / "results"
    assert main(["import", str(stale_out), "--row", "sglang-0.5.17", "--results", str(results), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert "no tiers.json" in err and err.count("\n") == 1
    assert not list(results.glob("r/*"))


def test_each_run_gets_its_own_invocation_id(tmp_path):
    out = tmp_path / "box"
    ids = []
    for _ in range(2):
        assert run_gpu_box(out, "--no-such-option").returncode == 4
        ids.append(json.loads((out / schema.INVOCATION_FILE).read_text())["invocation_id"])
    assert ids[0] != ids[1]
