"""What the checks of the request families added for issue #38 share (test_smoke_<family>.py, one module of
mtpmatrix.tiers.surface each): the family's answered exchanges on a server, its no-MTP reference server's, and the one
failure line that sums their problems."""

from __future__ import annotations

import pytest

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import answered

# The problems a check keeps in its record: all of them as a rule, so that a known-upstream entry's "problems"
# signature (core/known_upstream.py) sees every one; a check with more is never excused by one.
RECORDED_PROBLEMS = 60


def fail(family, problems: list[str], n: int, record_property) -> None:
    """Record the problems (up to RECORDED_PROBLEMS) and fail with one line that counts them and names the first."""
    record_property("problems", problems[:RECORDED_PROBLEMS])
    if problems:
        raise CheckFailure(
            "mismatch", f"{len(problems)} problem(s) over {n} {family.NAME} requests; first: {problems[0]}"
        )


def reference(family, smoke_runs, record_property):
    """The family's exchanges on its no-MTP reference server; the check skips where that server is not selected."""
    if family.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{family.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    run = replay_run(smoke_runs[family.REFERENCE_SERVER], record_property)
    return run.exchanges(family.NAME)


def exchanges(family, smoke_runs, name, record_property, labels=None):
    """(run, the family's exchanges on server ``name``), every planned request answered (surface.answered); with
    ``labels``, those requests only (the others' failures are their own checks')."""
    run = replay_run(smoke_runs[name], record_property)
    return run, answered(run, family.NAME, len(family.requests(run.spec, run.vocab_size)), labels)
