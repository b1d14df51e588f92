"""Smoke tier, request family "structured" (mtpmatrix.tiers.surface.structured): structured output at topk 1 and 3 beside unconstrained requests."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import answered, structured

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if structured.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


def _fail(problems: list[str], n: int) -> None:
    if problems:
        raise CheckFailure("mismatch", f"{len(problems)} problem(s) over {n} structured requests; first: {problems[0]}")


def _reference(smoke_runs, record_property):
    if structured.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{structured.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    run = replay_run(smoke_runs[structured.REFERENCE_SERVER], record_property)
    return run.exchanges(structured.NAME)


def _exchanges(smoke_runs, name, record_property):
    run = replay_run(smoke_runs[name], record_property)
    return run, answered(run, structured.NAME, len(structured.requests(run.spec, run.vocab_size)))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_structured_as_predicted(smoke_runs, name, record_property):
    """Every constrained request (regex, ebnf, json_schema) on every witness server: its text valid under its grammar and equal to the prediction (the chain where the grammar allows it, the one allowed character where it does not: structured.CASES), ended by a stop token with finish_reason stop; every unconstrained neighbour in the same batch on the +1 chain."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = structured.own_problems(exchanges, run.vocab_size)
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_structured_match_no_mtp(smoke_runs, name, record_property):
    """Each request on an MTP witness server (topk 1, 3) equals the witness without MTP: constrained output_ids with the byte-fallback twins folded (the grammar allows both alike, structured.fold), the unconstrained neighbours' output_ids as they are."""
    reference = _reference(smoke_runs, record_property)
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = structured.against_reference(exchanges, reference)
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))
