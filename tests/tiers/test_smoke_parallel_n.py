"""Smoke tier, request family "parallel_n" (mtpmatrix.tiers.surface.parallel_n): n > 1."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import parallel_n

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if parallel_n.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_parallel_n_as_predicted(smoke_runs, name, record_property):
    """Each n > 1 request answers n samples, each the greedy +1 chain with completion_tokens as asked."""
    run, exchanges = surface_family.exchanges(parallel_n, smoke_runs, name, record_property)
    problems = [p for x in exchanges for p in parallel_n.own_problems(x, run.vocab_size)]
    surface_family.fail(parallel_n, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_parallel_n_match_no_mtp(smoke_runs, name, record_property):
    """Every sample of each n > 1 request on an MTP witness server equals the witness without MTP's."""
    reference = surface_family.reference(parallel_n, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(parallel_n, smoke_runs, name, record_property)
    problems = parallel_n.against_reference(exchanges, reference)
    surface_family.fail(parallel_n, problems, len(exchanges), record_property)
