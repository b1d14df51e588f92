"""Smoke tier, request family "hidden_states" (mtpmatrix.tiers.surface.hidden_states): return_hidden_states under MTP, per request in a batch."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import hidden_states

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if hidden_states.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.fixture(scope="module")
def witness_rows(smoke_runs, build_tiny_pair):
    """Every input token's predicted row, from the served witness target's own checkpoint."""
    pair = build_tiny_pair(smoke_servers.collection_options().pair, hidden_states.PAIR)
    return hidden_states.predicted_rows(pair.target)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_hidden_states_as_predicted(smoke_runs, witness_rows, name, record_property):
    """Each request that asks for hidden states gets a block of one row per prompt token, then one row per output token after the first, each 128 wide; those that do not ask get none; and every row is the witness's prediction for its input token, sqrt(H) * E[x] from the served checkpoint, within hidden_states.ROW_RTOL (2 bf16 ulps, derived in the module; element 1 of 21 rows sglang returned on an H200, 0.5.13 and 0.5.17, within 0.34%: docs/runs/2026-12-05c-cpu-hidden-state-prediction.md; whole rows proven against transformers' forward in the reference tier). A wrong row is named by whose row it is."""
    run, exchanges = surface_family.exchanges(hidden_states, smoke_runs, name, record_property)
    problems = [p for x in exchanges for p in hidden_states.count_problems(x)]
    problems += hidden_states.prediction_problems(exchanges, witness_rows)
    surface_family.fail(hidden_states, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_hidden_states_match_no_mtp(smoke_runs, witness_rows, name, record_property):
    """Each asking request's rows on an MTP witness server equal the witness without MTP's, row by row, element by element within hidden_states.ROW_RTOL (2 bf16 ulps relative); a row that differs is named on each side by whose row it is."""
    reference = surface_family.reference(hidden_states, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(hidden_states, smoke_runs, name, record_property)
    problems = hidden_states.against_reference(exchanges, reference, witness_rows)
    surface_family.fail(hidden_states, problems, len(exchanges), record_property)
