"""The suite's fingerprint: a hash of what decides what a run tests and how it is judged.

Covered: the tier tests (``tests/conftest.py``, ``tests/tiers/**``), the code they run (``src/mtpmatrix/tiers/**``,
``pairs/**``, ``serving/**`` and the shared modules they import from core: expected, schema, settings, stats, kinds,
failures, smoke_servers, known_upstream), the expected checks of each tier (``expected_checks.json``), pytest's
configuration at the checkout root (a ``conftest.py`` there, ``pytest.ini``, ``.pytest.ini``, ``tox.ini``,
``setup.cfg`` whole, and pyproject.toml's ``[tool.pytest*]`` tables: what pytest reads before any test runs) and the
GSM8K data's checksum. Not covered: the
runner, the report and the known-upstream list, which judge records again every time and so change no record's
meaning; ``changed_files`` names those of them, with the suite's, that differ from the commit.

Every record carries the fingerprint of the suite that wrote it (the pytest plugin stamps tiers.json); the report
compares it with the run's manifest and with this checkout's, and a record from another suite is "not proven",
never judged against a yardstick it was not written for. The commit is recorded beside it for people; only the hash
decides.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from mtpmatrix.core import settings
from mtpmatrix.core.paths import REPO, SUITE
from mtpmatrix.core.record_types import Fingerprint

# (folder, glob) pairs whose files make up the suite, relative to REPO
SUITE_FILES = (
    ("tests", "conftest.py"),
    (SUITE, "**/*.py"),
    ("src/mtpmatrix/tiers", "**/*.py"),
    ("src/mtpmatrix/pairs", "**/*.py"),  # the pairs the tiers build and their predictions
    ("src/mtpmatrix/serving", "**/*.py"),  # how the tiers launch and talk to sglang
    ("src/mtpmatrix/core", "expected.py"),
    ("src/mtpmatrix/core", "expected_checks.json"),
    ("src/mtpmatrix/core", "failures.py"),  # how the tiers classify a failure (kind, first frame)
    ("src/mtpmatrix/core", "kinds.py"),  # what the tiers classify failures into
    ("src/mtpmatrix/core", "known_upstream.py"),  # the matching; the list itself (the json) is not covered
    ("src/mtpmatrix/core", "schema.py"),
    ("src/mtpmatrix/core", "settings.py"),
    ("src/mtpmatrix/core", "smoke_servers.py"),  # the smoke tier's servers and knobs
    ("src/mtpmatrix/core", "stats.py"),
    # pytest's own configuration: a root conftest.py or an ini file changes what runs and how, with no test changed
    (".", "conftest.py"),
    (".", "pytest.ini"),
    (".", ".pytest.ini"),
    (".", "tox.ini"),
    (".", "setup.cfg"),
)
PYPROJECT = "pyproject.toml"  # only its [tool.pytest*] tables are the suite's (pytest_config)
KNOWN_UPSTREAM = "src/mtpmatrix/core/known_upstream.json"


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
    if not any(p.parent == Path(repo) / SUITE for p in files):
        raise FingerprintError(f"no tier tests under {Path(repo) / SUITE}: the suite is not here")
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(repo).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    h.update(b"pytest-config\0" + json.dumps(pytest_config(repo), sort_keys=True).encode())
    h.update(b"data\0" + (data if data is not None else data_sha256()).encode())
    return h.hexdigest()


def pytest_config(repo: Path = REPO, text: str | None = None) -> dict[str, Any]:
    """pyproject.toml's ``[tool.pytest*]`` tables (``text``: that file's content, else read from ``repo``): the
    options pytest takes from it (addopts, markers, ...); the rest of the file is not the suite."""
    try:
        raw = tomllib.loads(text if text is not None else (Path(repo) / PYPROJECT).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {k: v for k, v in (raw.get("tool") or {}).items() if k == "pytest" or k.startswith("pytest.")}


def git(repo: Path, *args: str, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def _verdict_pathspecs() -> list[str]:
    """git pathspecs of every file that decides a verdict: the suite's files and the known-upstream list."""
    out = []
    for folder, pattern in SUITE_FILES:
        out.append(folder if "*" in pattern else (pattern if folder == "." else f"{folder}/{pattern}"))
    return [*out, PYPROJECT, KNOWN_UPSTREAM]


def committed_text(repo: Path, rel: str) -> str | None:
    """``rel`` as the checkout's commit holds it; None when there is no commit or it holds no such file."""
    return git(repo, "show", f"HEAD:{rel}")


def changed_files(repo: Path = REPO, also: tuple[str, ...] = ()) -> list[str] | None:
    """The verdict-deciding files of ``repo`` (the suite's, known_upstream.json, and the paths ``also`` names) that
    differ from its commit: changed, added, deleted or not tracked; pyproject.toml only when its pytest tables differ.
    None when ``repo`` is no git checkout (nothing to compare with)."""
    paths = uncommitted(repo, [*_verdict_pathspecs(), *also])
    if paths is None:
        return None
    pytest_same = PYPROJECT in paths and pytest_config(repo) == pytest_config(
        repo, committed_text(repo, PYPROJECT) or ""
    )
    return [p for p in paths if not (p == PYPROJECT and pytest_same)]


def uncommitted(repo: Path, pathspecs: list[str]) -> list[str] | None:
    """The files under ``pathspecs`` that differ from ``repo``'s commit (changed, added, deleted or not tracked),
    sorted; None when ``repo`` is no git checkout."""
    if git(repo, "rev-parse", "HEAD") is None:
        return None
    status = git(repo, "status", "--porcelain", "--untracked-files=all", "--", *pathspecs, strip=False)
    if status is None:
        return None
    out = set()
    for line in status.splitlines():
        path = line[3:].split(" -> ")[-1].strip().strip('"')  # "XY path", "R  old -> new"
        if path and "__pycache__" not in path:
            out.add(path)
    return sorted(out)


@functools.cache
def describe(repo: Path = REPO) -> Fingerprint:
    """``{"suite": hash, "data": sha256, "commit": sha or None, "dirty": bool or None, "changed": [path] or None}``
    of the suite in ``repo`` (``changed``: changed_files); what tiers.json, row.json and the manifest carry."""
    data = data_sha256()
    commit = git(repo, "rev-parse", "HEAD")
    status = git(repo, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "suite": suite_hash(repo, data),
        "data": data,
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "changed": changed_files(repo) if commit else None,
    }


def short(fp: Fingerprint | str | None) -> str:
    """A fingerprint as people read it: 12 hex digits (and the commit's 9, when known)."""
    if isinstance(fp, dict):
        s = str(fp.get("suite") or "?")[:12]
        c = fp.get("commit")
        return f"{s} (commit {str(c)[:9]}{'+dirty' if fp.get('dirty') else ''})" if c else s
    return str(fp or "?")[:12]
