"""Smoke tier, request family "hidden_states" (mtpmatrix.tiers.surface.hidden_states): return_hidden_states under MTP, per request in a batch."""

from __future__ import annotations

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving.runs import replay_run
from mtpmatrix.tiers.surface import answered, hidden_states

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if hidden_states.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


def _fail(problems: list[str], n: int) -> None:
    if problems:
        raise CheckFailure(
            "mismatch", f"{len(problems)} problem(s) over {n} hidden_states requests; first: {problems[0]}"
        )


def _reference(smoke_runs, record_property):
    if hidden_states.REFERENCE_SERVER not in smoke_runs:
        pytest.skip(f"{hidden_states.REFERENCE_SERVER} not selected (MTPMATRIX_SMOKE_SERVERS)")
    run = replay_run(smoke_runs[hidden_states.REFERENCE_SERVER], record_property)
    return run.exchanges(hidden_states.NAME)


def _exchanges(smoke_runs, name, record_property):
    run = replay_run(smoke_runs[name], record_property)
    return run, answered(run, hidden_states.NAME, len(hidden_states.requests(run.spec, run.vocab_size)))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_hidden_states_as_predicted(smoke_runs, name, record_property):
    """Each request that asks for hidden states gets a block of one row per prompt token, then one row per output token after the first, each 128 wide; those that do not ask get none; and on the server alone every row computed at the same input token is the same vector within hidden_states.ROW_RTOL (2 bf16 ulps, derived in the module: the witness's row depends on its input token alone)."""
    run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = [p for x in exchanges for p in hidden_states.count_problems(x)] + hidden_states.consistency_problems(
        exchanges
    )
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_hidden_states_match_no_mtp(smoke_runs, name, record_property):
    """Each asking request's rows on an MTP witness server equal the witness without MTP's, row by row, element by element within hidden_states.ROW_RTOL (2 bf16 ulps relative)."""
    reference = _reference(smoke_runs, record_property)
    _run, exchanges = _exchanges(smoke_runs, name, record_property)
    problems = hidden_states.against_reference(exchanges, reference)
    record_property("problems", problems[:20])
    _fail(problems, len(exchanges))
