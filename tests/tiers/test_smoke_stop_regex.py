"""Smoke tier, request family "stop_regex" (mtpmatrix.tiers.surface.stop_regex): stop_regex matching inside an accepted run."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import answered, stop_regex

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if stop_regex.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


def _fail(problems: list[str], n: int) -> None:
    if problems:
        raise CheckFailure("mismatch", f"{len(problems)} problem(s) over {n} stop_regex requests; first: {problems[0]}")


def _reference(smoke_runs, record_property):
    if stop_regex.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{stop_regex.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    run = replay_run(smoke_runs[stop_regex.REFERENCE_SERVER], record_property)
    return run.exchanges(stop_regex.NAME)


def _exchanges(smoke_runs, name, record_property):
    run = replay_run(smoke_runs[name], record_property)
    return run, answered(run, stop_regex.NAME, len(stop_regex.requests(run.spec, run.vocab_size)))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_stop_regex_as_predicted(smoke_runs, name, record_property):
    """Every stop_regex request ends exactly at the token that completes the pattern's first match (prefill token, inside a verify step's accepted drafts, on its bonus token), finish_reason stop with the pattern as matched."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = [
        p
        for x in exchanges
        for p in stop_regex.problems({c.label: c for c in stop_regex.CASES}[x.label], x, run.vocab_size)
    ]
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_stop_regex_match_no_mtp(smoke_runs, name, record_property):
    """Each stop_regex request's output_ids on an MTP witness server equal the witness without MTP's."""
    reference = _reference(smoke_runs, record_property)
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = stop_regex.against_reference(exchanges, reference)
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))
