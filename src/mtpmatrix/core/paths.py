"""Where things are, defined once: the checkout, the row files, the results root, and how a run folder is named.

    REPO                 the checkout (src/mtpmatrix/core/paths.py -> three folders up)
    SUITE                the tier tests, relative to the checkout: what a row's pytest runs, what is fingerprinted
    CONSTRAINTS_DIR      the row files, constraints/<row>.txt (canaries: constraints/canary/)
    results_root()       results/ unless $MTPMATRIX_RESULTS_ROOT says otherwise: results/<run-id>/<row-id>/
    new_run_id(kind)     a run folder's name: a UTC time (RUN_ID_TIME), after the prefix of its kind
    single_name(id)      a run or row id given by a user or a record: one folder name, never a path
    now()                a record's start/finish time: UTC, ISO 8601, seconds

Run folders: a matrix run is named by its time alone (``20260304-050607``) or by the user (``--run-id``); the
others carry the prefix of their kind, so the report's default run and ``--resume`` stay on the user's own matrix
(``SIDE_RUN_PREFIXES``): bisect probes (``bisect-<time>``, a canary's ``bisect-<run>-<canary>``), the CI row
(``ci-<time>``, ``nox -t ci``) and fault injection (``mutants-<time>``).
"""

from __future__ import annotations

import datetime as _dt
import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # src/mtpmatrix
REPO = PACKAGE.parents[1]
CONSTRAINTS_DIR = REPO / "constraints"
SUITE = "tests/tiers"  # relative (a pytest argument run from the checkout, a path under any checkout's root)

# Where results go unless --results says otherwise (results/<run-id>/<row-id>/).
RESULTS_ROOT_ENV = "MTPMATRIX_RESULTS_ROOT"


def results_root(env: Mapping[str, str] | None = None) -> Path:
    """The default results root: $MTPMATRIX_RESULTS_ROOT, else ./results."""
    return Path((os.environ if env is None else env).get(RESULTS_ROOT_ENV) or "results")


# --- run ids --------------------------------------------------------------------------------------------------
RUN_ID_TIME = "%Y%m%d-%H%M%S"  # sortable: the newest run is the largest name
MATRIX = ""  # a matrix run: the time alone
BISECT = "bisect-"  # bisect probes
CI = "ci-"  # the CI row (nox -t ci)
MUTANTS = "mutants-"  # fault injection (python -m mtpmatrix mutants; its own folder, never a run of rows)
# Run folders that are not the matrix a user ran.
SIDE_RUN_PREFIXES = (BISECT, CI)
# The row files' tag of the row CI runs (nox -t ci, its ci_row session) and fault injection defaults to.
CI_TAG = "ci"


def new_run_id(now: _dt.datetime | None = None, *, kind: str = MATRIX) -> str:
    """A new run folder's name: ``kind`` (a prefix above) and the UTC time."""
    return kind + (now or _dt.datetime.now(_dt.UTC)).strftime(RUN_ID_TIME)


class NameError_(ValueError):
    """A run or row id that is not one plain folder name; the message is one line."""


def single_name(value: str, what: str = "--run-id") -> str:
    """``value`` when it names one folder inside its parent (results/<run-id>/<row-id>/): not empty, no path
    separator, not '.' or '..', not hidden (a folder starting with '.' is a staging folder no reader takes), no
    control or invisible format characters (a zero-width space, a right-to-left override: a name that prints as
    another run's), no space at either end; NameError_ (one line) otherwise."""
    if (
        not isinstance(value, str)
        or not value
        or value in (".", "..")
        or value.startswith(".")
        or value != value.strip()
        or any(sep in value for sep in ("/", "\\", os.sep))
        or any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value)
    ):
        raise NameError_(
            f"{what} {value!r} is not one folder name (no '/', not '.', '..' or hidden, no space at either end, "
            "no control or invisible character)"
        )
    return value


def canary_probes_run(run_id: str, canary_id: str) -> str:
    """The run folder of the bisect probes a canary's culprit search runs."""
    return f"{BISECT}{run_id}-{canary_id}"


def now() -> str:
    """A record's time stamp: UTC, ISO 8601, to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
