"""The checkout that judges a run, against its commit: the files that decide a verdict (the suite's, the expected
checks, the thresholds in settings.py, the known-upstream list; fingerprint.changed_files) that differ from the
commit are named in the report's headline, and an excuse that is not committed never turns a failure into a pass:
with known_upstream.json changed, the report applies the list as the commit holds it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mtpmatrix.core import known_upstream
from mtpmatrix.core.evidence import fingerprint
from mtpmatrix.core.paths import REPO


def state(repo: Path = REPO) -> dict[str, Any]:
    """``{"commit": sha or None, "changed": [path]}``: the checkout's commit and its verdict-deciding files that
    differ from it (none when it is no git checkout: nothing to compare with)."""
    return {"commit": fingerprint.git(repo, "rev-parse", "HEAD"), "changed": fingerprint.changed_files(repo) or []}


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
