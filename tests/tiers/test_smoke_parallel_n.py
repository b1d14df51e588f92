"""Smoke tier, request family "parallel_n" (mtpmatrix.tiers.surface.parallel_n): n > 1."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import answered, parallel_n

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if parallel_n.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


def _fail(problems: list[str], n: int) -> None:
    if problems:
        raise CheckFailure("mismatch", f"{len(problems)} problem(s) over {n} parallel_n requests; first: {problems[0]}")


def _reference(smoke_runs, record_property):
    if parallel_n.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{parallel_n.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    run = replay_run(smoke_runs[parallel_n.REFERENCE_SERVER], record_property)
    return run.exchanges(parallel_n.NAME)


def _exchanges(smoke_runs, name, record_property):
    run = replay_run(smoke_runs[name], record_property)
    return run, answered(run, parallel_n.NAME, len(parallel_n.requests(run.spec, run.vocab_size)))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_parallel_n_as_predicted(smoke_runs, name, record_property):
    """Each n > 1 request answers n samples, each the greedy +1 chain with completion_tokens as asked."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = [p for x in exchanges for p in parallel_n.own_problems(x, run.vocab_size)]
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_parallel_n_match_no_mtp(smoke_runs, name, record_property):
    """Every sample of each n > 1 request on an MTP witness server equals the witness without MTP's."""
    reference = _reference(smoke_runs, record_property)
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = parallel_n.against_reference(exchanges, reference)
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))
