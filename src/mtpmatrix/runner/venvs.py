"""uv and fresh venvs: what the row run, bisect probes, canaries and candidates share. Imports nothing of the runner,
so each of them can use it without importing the others."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def find_uv(error: type[Exception]) -> str:
    """uv's path; ``error`` (the caller's one-line error kind) when uv is not on PATH."""
    uv = shutil.which("uv")
    if uv is None:
        raise error("uv is not on PATH: pip install uv (https://docs.astral.sh/uv/)")
    return uv


def make_venv(row, venv: Path, error: type[Exception]) -> Path:
    """A fresh, empty uv venv with the row's Python at ``venv``; ``error`` (one line) when uv cannot make it."""
    uv = find_uv(error)
    venv = Path(venv)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)  # UV_PYTHON_DOWNLOADS=never (air-gapped machines) is honoured as set
    env.pop("VIRTUAL_ENV", None)
    made = subprocess.run([uv, "venv", "--python", row.python, str(venv)], capture_output=True, text=True, env=env)
    if made.returncode != 0:
        why = (made.stderr or made.stdout).strip().splitlines()
        raise error(
            f"cannot create a Python {row.python} venv for row {row.id}: {why[-1] if why else 'uv venv failed'}"
        )
    return venv
