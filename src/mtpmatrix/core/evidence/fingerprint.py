"""The suite's fingerprint: a hash of what decides what a run tests and how it is judged.

Covered: the tier tests (``tests/conftest.py``, ``tests/tiers/**``), the code they run (``src/mtpmatrix/tiers/**``,
``pairs/**``, ``serving/**`` and the shared modules they import from core: expected, schema, settings, stats, kinds, smoke_servers,
known_upstream), the expected checks of each tier (``expected_checks.json``) and the GSM8K data's checksum. Not covered: the runner, the report and the known-upstream
list, which judge records again every time and so change no record's meaning.

Every record carries the fingerprint of the suite that wrote it (the pytest plugin stamps tiers.json); the report
compares it with the run's manifest and with this checkout's, and a record from another suite is "not proven",
never judged against a yardstick it was not written for. The commit is recorded beside it for people; only the hash
decides.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from mtpmatrix.core import settings
from mtpmatrix.core.paths import REPO
from mtpmatrix.core.record_types import Fingerprint

# (folder, glob) pairs whose files make up the suite, relative to REPO
SUITE_FILES = (
    ("tests", "conftest.py"),
    ("tests/tiers", "**/*.py"),
    ("src/mtpmatrix/tiers", "**/*.py"),
    ("src/mtpmatrix/pairs", "**/*.py"),  # the pairs the tiers build and their predictions
    ("src/mtpmatrix/serving", "**/*.py"),  # how the tiers launch and talk to sglang
    ("src/mtpmatrix/core", "expected.py"),
    ("src/mtpmatrix/core", "expected_checks.json"),
    ("src/mtpmatrix/core", "kinds.py"),  # what the tiers classify failures into
    ("src/mtpmatrix/core", "known_upstream.py"),  # the matching; the list itself (the json) is not covered
    ("src/mtpmatrix/core", "schema.py"),
    ("src/mtpmatrix/core", "settings.py"),
    ("src/mtpmatrix/core", "smoke_servers.py"),  # the smoke tier's servers and knobs
    ("src/mtpmatrix/core", "stats.py"),
)


class FingerprintError(RuntimeError):
    """The suite's files are not there (an installed wheel without the tests): nothing can be fingerprinted."""


def suite_files(repo: Path = REPO) -> list[Path]:
    files: set[Path] = set()
    for folder, pattern in SUITE_FILES:
        base = Path(repo) / folder
        files.update(p for p in base.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(files)


def data_sha256() -> str:
    """The GSM8K test split's checksum as the tiers verify it (settings.GSM8K_SHA256)."""
    return settings.GSM8K_SHA256["test"]


def suite_hash(repo: Path = REPO, data: str | None = None) -> str:
    """sha256 over every suite file's path and bytes, and the data's checksum."""
    files = suite_files(repo)
    if not any(p.parent.name == "tiers" and p.parent.parent.name == "tests" for p in files):
        raise FingerprintError(f"no tier tests under {Path(repo) / 'tests/tiers'}: the suite is not here")
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(repo).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    h.update(b"data\0" + (data if data is not None else data_sha256()).encode())
    return h.hexdigest()


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def describe(repo: Path = REPO) -> Fingerprint:
    """``{"suite": hash, "data": sha256, "commit": sha or None, "dirty": bool or None}`` of the suite in ``repo``;
    what tiers.json, row.json and the manifest carry."""
    data = data_sha256()
    commit = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "suite": suite_hash(repo, data),
        "data": data,
        "commit": commit,
        "dirty": None if status is None else bool(status),
    }


def short(fp: Fingerprint | str | None) -> str:
    """A fingerprint as people read it: 12 hex digits (and the commit's 9, when known)."""
    if isinstance(fp, dict):
        s = str(fp.get("suite") or "?")[:12]
        c = fp.get("commit")
        return f"{s} (commit {str(c)[:9]}{'+dirty' if fp.get('dirty') else ''})" if c else s
    return str(fp or "?")[:12]
