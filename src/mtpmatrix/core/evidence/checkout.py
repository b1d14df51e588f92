"""The checkout that judges a run, against what vouches for its files: the files that decide a verdict (the suite's,
the expected checks, the thresholds in settings.py, the known-upstream list: fingerprint.changed_files; and the
judge's own code, JUDGE_CODE) that differ from the git commit are named in the report's headline, and an excuse that is not committed never turns a failure
into a pass: with known_upstream.json changed, the report applies the list as the commit holds it.

Without git, an installed distribution (``pip install`` of this project: a wheel) vouches for the files it installed
by its RECORD (a sha256 per file): those that differ from it are named. A tree with neither (a tarball on
PYTHONPATH) has nothing to hold its files to: evidence.run makes its judgement "not proven"."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from mtpmatrix.core import known_upstream
from mtpmatrix.core.evidence import fingerprint
from mtpmatrix.core.paths import PACKAGE, REPO

_SRC = "src/mtpmatrix"
# The judge's own code: what re-derives every verdict when a report is made (the evidence rules, the expected checks,
# the store, the report's summary and exit status). It never runs on the box, so it is no part of the suite's
# fingerprint; an uncommitted edit of it is named with the suite's own (a judgement by code nobody committed).
JUDGE_CODE = ("src/mtpmatrix/core", "src/mtpmatrix/report", "src/mtpmatrix/__main__.py")


def commit(repo: Path = REPO) -> str | None:
    """The git commit of ``repo``, None when ``repo`` is not the top of a git checkout (a tarball; an installed
    package whose venv happens to sit inside someone's git tree is not that tree's checkout)."""
    top = fingerprint.git(repo, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(repo).resolve():
        return None
    return fingerprint.git(repo, "rev-parse", "HEAD")


def state(repo: Path = REPO, package: Path = PACKAGE) -> dict[str, Any]:
    """``{"commit": sha or None, "changed": [path], "distribution": "name version" or None}``: the checkout's commit
    and its verdict-deciding files that differ from it; without a commit, the installed distribution whose RECORD
    lists the package that runs here, and the files that differ from its RECORD (none of either: a bare tree)."""
    sha = commit(repo)
    if sha is not None:
        return {"commit": sha, "changed": fingerprint.changed_files(repo, JUDGE_CODE) or [], "distribution": None}
    installed = distribution_state(package)
    return {
        "commit": None,
        "changed": installed[1] if installed else [],
        "distribution": installed[0] if installed else None,
    }


def _is_verdict_file(rel: PurePosixPath) -> bool:
    """Whether ``rel`` (relative to the package's parent: ``mtpmatrix/core/settings.py``) is a verdict-deciding file
    a distribution installs: fingerprint.SUITE_FILES under src/mtpmatrix, the known-upstream list and JUDGE_CODE."""
    path = f"src/{rel.as_posix()}"
    if path == fingerprint.KNOWN_UPSTREAM:
        return True
    if "__pycache__" not in rel.parts and any(path == j or path.startswith(j + "/") for j in JUDGE_CODE):
        return True
    for folder, pattern in fingerprint.SUITE_FILES:
        if not folder.startswith(_SRC) or "__pycache__" in rel.parts:
            continue
        if pattern == "**/*.py" and path.startswith(folder + "/") and path.endswith(".py"):
            return True
        if path == f"{folder}/{pattern}":
            return True
    return False


def _record_hash(path: Path) -> str:
    """sha256 as a wheel's RECORD writes it: urlsafe base64, no padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def distribution_state(package: Path = PACKAGE) -> tuple[str, list[str]] | None:
    """("name version", [verdict-deciding files that differ from its RECORD: changed, added or missing]) of the
    installed distribution whose RECORD lists ``package``'s own ``__init__.py``; None when none does (a source tree
    on PYTHONPATH, an editable install, whose RECORD lists no file of the tree)."""
    package = Path(package).resolve()
    for name in md.packages_distributions().get(package.name) or []:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        listed: dict[PurePosixPath, str | None] = {}
        for f in dist.files or []:
            where = Path(str(dist.locate_file(f))).resolve()
            if where.is_relative_to(package):
                listed[PurePosixPath(where.relative_to(package.parent).as_posix())] = (
                    f.hash.value if f.hash is not None and f.hash.mode == "sha256" else None
                )
        if PurePosixPath(package.name, "__init__.py") not in listed:
            continue  # another copy of the package: not the one that runs here
        on_disk = {
            PurePosixPath(p.relative_to(package.parent).as_posix())
            for p in package.rglob("*")
            if p.is_file() and p.suffix not in (".pyc", ".pyo")
        }
        differ = []
        for rel in sorted(p for p in on_disk | set(listed) if _is_verdict_file(p)):
            if rel not in on_disk or rel not in listed or listed[rel] != _record_hash(package.parent / rel):
                differ.append(rel.as_posix())
        return f"{dist.metadata['Name']} {dist.version}", differ
    return None


def known_issues(repo: Path = REPO) -> list[known_upstream.KnownIssue]:
    """The known upstream issues the checkout may excuse failures with: known_upstream.load(), or, when the list
    differs from the commit, the commit's list (none when the commit has no list)."""
    if fingerprint.KNOWN_UPSTREAM not in (fingerprint.changed_files(repo) or []):
        return known_upstream.load()
    text = fingerprint.committed_text(repo, fingerprint.KNOWN_UPSTREAM)
    if text is None:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        committed = Path(tmp) / Path(fingerprint.KNOWN_UPSTREAM).name
        committed.write_text(text)
        return known_upstream.load(committed)
