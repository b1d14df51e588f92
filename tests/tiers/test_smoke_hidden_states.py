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


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_hidden_states_as_predicted(smoke_runs, name, record_property):
    """Each request that asks for hidden states gets a block of one row per prompt token, then one row per output token after the first, each 128 wide; those that do not ask get none; and on the server alone every row computed at the same input token is the same vector within hidden_states.ROW_RTOL (2 bf16 ulps, derived in the module: the witness's row depends on its input token alone)."""
    run, exchanges = surface_family.exchanges(hidden_states, smoke_runs, name, record_property)
    problems = [p for x in exchanges for p in hidden_states.count_problems(x)] + hidden_states.consistency_problems(
        exchanges
    )
    record_property("problems", problems[:20])
    surface_family.fail(hidden_states, problems, len(exchanges))


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_hidden_states_match_no_mtp(smoke_runs, name, record_property):
    """Each asking request's rows on an MTP witness server equal the witness without MTP's, row by row, element by element within hidden_states.ROW_RTOL (2 bf16 ulps relative)."""
    reference = surface_family.reference(hidden_states, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(hidden_states, smoke_runs, name, record_property)
    problems = hidden_states.against_reference(exchanges, reference)
    record_property("problems", problems[:20])
    surface_family.fail(hidden_states, problems, len(exchanges))
