"""The expected checks of each tier, defined in the project (``src/mtpmatrix/core/expected_checks.json``), not read from
what a box happened to collect: a suite cut to a few checks, or an older suite without a check, cannot define its own
yardstick.

The file is what ``tests/tiers`` collects with no ``MTPMATRIX_*`` knob and no ``--server-url``: every default smoke
server's checks, the GSM8K seed cases', every contract and reference check. Adding or renaming a check means
writing the file again (``python tools/expected_checks.py --write``) and so changes the suite's fingerprint;
tests/unit/test_expected_checks.py fails while the file and the suite disagree.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mtpmatrix.core.paths import SUITE
from mtpmatrix.core.schema import TIERS

FILE = Path(__file__).resolve().parents[1] / "expected_checks.json"
# Another definition, for suites that are not this project's (the runner's own unit tests run made-up suites): a file,
# or AS_COLLECTED (each tier's expected set is what its session collected). A knob the evidence judge does not list:
# whatever is judged under it is not the qualification suite.
ENV = "MTPMATRIX_EXPECTED_CHECKS"
AS_COLLECTED = "collected"


class ExpectedChecksError(ValueError):
    """The definition is missing or malformed; one line."""


def load(path: Path | None = None) -> dict[str, tuple[str, ...]] | None:
    """{tier: check ids} of the definition (``path``, else $MTPMATRIX_EXPECTED_CHECKS, else FILE); None when that
    says AS_COLLECTED."""
    chosen = path or os.environ.get(ENV) or FILE
    return None if chosen == AS_COLLECTED else _load(Path(chosen))


@functools.cache
def _load(path: Path) -> dict[str, tuple[str, ...]]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ExpectedChecksError(f"{path}: {exc}") from None
    tiers = raw.get("tiers") if isinstance(raw, dict) else None
    if (
        not isinstance(tiers, dict)
        or set(tiers) != set(TIERS)
        or not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in tiers.values())
    ):
        raise ExpectedChecksError(f"{path}: want {{'tiers': {{tier: [check id, ...]}}}} for {', '.join(TIERS)}")
    return {t: tuple(tiers[t]) for t in TIERS}


def collect(repo: Path, python: str = sys.executable) -> dict[str, list[str]]:
    """What ``tests/tiers`` collects in ``repo`` with no MTPMATRIX_* knob: the plugin's own record of it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}
    env["PYTHONPATH"] = str(Path(repo) / "src")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tiers.json"
        done = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                SUITE,
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--mtp-results={out}",
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
        )
        if not out.is_file() or done.returncode != 0:
            # a module that fails to import is missing from what the plugin records: a definition written from
            # such a collection would quietly drop its checks
            raise ExpectedChecksError(
                f"collecting {SUITE} failed (exit {done.returncode}"
                f"{'' if out.is_file() else ', no results'}): "
                f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}"
            )
        collected = json.loads(out.read_text())["selection"]["collected"]
    return {t: list(collected.get(t) or []) for t in TIERS}


def render(collected: dict[str, list[str]]) -> str:
    return (
        json.dumps(
            {"about": "the expected checks of each tier: python tools/expected_checks.py --write", "tiers": collected},
            indent=1,
        )
        + "\n"
    )
