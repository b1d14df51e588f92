"""Smoke tier, request family "structured" (mtpmatrix.tiers.surface.structured): structured output at topk 1 and 3 beside unconstrained requests."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import structured

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if structured.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_structured_as_predicted(smoke_runs, name, record_property):
    """Every constrained request (regex, ebnf, json_schema) on every witness server: its text valid under its grammar and equal to the prediction (the chain where the grammar allows it, the one allowed character where it does not: structured.CASES), ended by a stop token with finish_reason stop; every unconstrained neighbour in the same batch on the +1 chain."""
    run, exchanges = surface_family.exchanges(structured, smoke_runs, name, record_property)
    problems = structured.own_problems(exchanges, run.vocab_size)
    surface_family.fail(structured, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_structured_match_no_mtp(smoke_runs, name, record_property):
    """Each request on an MTP witness server (topk 1, 3) equals the witness without MTP: constrained output_ids with the byte-fallback twins folded (the grammar allows both alike, structured.fold), the unconstrained neighbours' output_ids as they are."""
    reference = surface_family.reference(structured, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(structured, smoke_runs, name, record_property)
    problems = structured.against_reference(exchanges, reference)
    surface_family.fail(structured, problems, len(exchanges), record_property)
