"""processes.py: ports, redaction, the SGLANG_* names an installed sglang knows, GPU contexts per pid."""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from mtpmatrix.serving import processes


def test_supported_env_filters_unknown_sglang_names():
    kept, dropped = processes.supported_env(
        {"SGLANG_KNOWN": "1", "SGLANG_TYPO": "1", "CUDA_VISIBLE_DEVICES": "0"}, known={"SGLANG_KNOWN"}
    )
    assert kept == {"SGLANG_KNOWN": "1", "CUDA_VISIBLE_DEVICES": "0"} and dropped == ["SGLANG_TYPO"]
    assert processes.supported_env({"A": "b"}) == ({"A": "b"}, [])


def _fake_sglang_python(tmp_path: Path, environ: str) -> tuple[Path, Path]:
    """(a "python" that imports a synthetic sglang, that sglang's package folder). The package raises on import:
    the env names must be read from its files, as from a real install, never by importing it."""
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the envs module is read, sglang is never imported')\n")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "environ.py").write_text(environ)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(pkg.parent))} exec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python, pkg


def test_sglang_env_names_read_from_installed_sglang(tmp_path):
    # the shape of sglang 0.5.17's srt/environ.py: class attributes named after the variables
    python, pkg = _fake_sglang_python(
        tmp_path,
        textwrap.dedent("""\
        class Envs:
            SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True)
            SGL_CHUNKED_PREFIX_CACHE_THRESHOLD = EnvInt(8192)
            # not names: lower case, or no SGLANG_/SGL_ prefix
            sglang_lower = 1
            CUDA_HOME = None
        """),
    )
    assert processes.sglang_package_dir(str(python)) == pkg
    assert processes.sglang_env_names(str(python)) == {
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
        "SGL_CHUNKED_PREFIX_CACHE_THRESHOLD",
    }
    kept, dropped = processes.supported_env(
        {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1", "SGLANG_TYPO": "1"}, str(python)
    )
    assert kept == {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"} and dropped == ["SGLANG_TYPO"]


def test_sglang_env_names_without_sglang():
    assert processes.sglang_env_names("/nonexistent/python") == frozenset()


def test_redaction_helpers():
    assert processes.redact_env({"HF_TOKEN": "x", "HUGGING_FACE_HUB_TOKEN": "y", "PATH": "/bin"}) == {
        "HF_TOKEN": "***",
        "HUGGING_FACE_HUB_TOKEN": "***",
        "PATH": "/bin",
    }
    assert processes.redact_args(["--api-key", "s", "--tp", "2", "--admin-api-key=z"]) == [
        "--api-key",
        "***",
        "--tp",
        "2",
        "--admin-api-key=***",
    ]


def test_redaction_keeps_token_count_options():
    args = [
        "--max-total-tokens",
        "32768",
        "--speculative-num-draft-tokens",
        "6",
        "--skip-tokenizer-init",
        "--model-path",
        "m",
        "--hf-token",
        "t",
        "--api-key=k",
    ]
    assert processes.redact_args(args) == [
        "--max-total-tokens",
        "32768",
        "--speculative-num-draft-tokens",
        "6",
        "--skip-tokenizer-init",
        "--model-path",
        "m",
        "--hf-token",
        "***",
        "--api-key=***",
    ]
    assert processes.redact_env({"TOKENIZERS_PARALLELISM": "false", "SGLANG_MAX_TOKENS": "1"}) == {
        "TOKENIZERS_PARALLELISM": "false",
        "SGLANG_MAX_TOKENS": "1",
    }


def test_free_port_avoids_the_ephemeral_range():
    import random

    lo, _hi = processes.ephemeral_port_range()
    if lo - 1001 <= 20000:
        pytest.skip(f"ephemeral range starts at {lo}: no room below it, free_port falls back to the kernel's pick")
    rng = random.Random(7)
    ports = {processes.free_port(rng=rng) for _ in range(20)}
    assert all(20000 <= p < lo - 1000 for p in ports), ports
    assert len(ports) > 1  # random, so side-by-side launches do not race for one port


def test_gpu_memory_by_pid_sums_gpus_and_keeps_unreadable_pids(monkeypatch):
    monkeypatch.setattr(processes, "nvidia_smi", lambda *a: "101, 3100\n102, 3100\n101, 3210\n103, [N/A]\n")
    assert processes.gpu_memory_by_pid() == {101: 6310, 102: 3100, 103: 0}
    assert processes.gpu_pids() == {101, 102, 103}  # a context with unreadable memory still counts for teardown
    monkeypatch.setattr(processes, "nvidia_smi", lambda *a: None)
    assert processes.gpu_memory_by_pid() is None and processes.gpu_pids() is None


def test_a_real_server_exits_at_once_when_its_scheduler_dies(tmp_path, monkeypatch):
    """sglang's crash handler waited 65 s for diagnostics nobody collects (H200 2026-12-05e: a mutant suite whose
    servers died at their readiness probe ran past its limit); a real server is launched with them off, unless the
    caller's environment asks for them; a stub launcher gets only what it is given."""
    from mtpmatrix.serving import server

    monkeypatch.setattr(server, "supported_env", lambda env, python: (dict(env or {}), []))
    monkeypatch.delenv("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", raising=False)
    monkeypatch.setenv("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "1")
    real = server.SglangServer([], log_path=tmp_path / "a.log", env={"X": "1"})
    assert real.env == {"SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0", "X": "1"}
    stub = server.SglangServer([], log_path=tmp_path / "b.log", launcher=["true"], env={"X": "1"})
    assert stub.env == {"X": "1"}
