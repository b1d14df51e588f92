"""Smoke tier, request family "stop_regex" (mtpmatrix.tiers.surface.stop_regex): stop_regex matching inside an accepted run."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import stop_regex

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if stop_regex.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_stop_regex_as_predicted(smoke_runs, name, record_property):
    """Every stop_regex request ends exactly at the token that completes the pattern's first match (prefill token, inside a verify step's accepted drafts, on its bonus token), finish_reason stop with the pattern as matched."""
    run, exchanges = surface_family.exchanges(stop_regex, smoke_runs, name, record_property)
    problems = [
        p
        for x in exchanges
        for p in stop_regex.problems({c.label: c for c in stop_regex.CASES}[x.label], x, run.vocab_size)
    ]
    surface_family.fail(stop_regex, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_stop_regex_match_no_mtp(smoke_runs, name, record_property):
    """Each stop_regex request's output_ids on an MTP witness server equal the witness without MTP's."""
    reference = surface_family.reference(stop_regex, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(stop_regex, smoke_runs, name, record_property)
    problems = stop_regex.against_reference(exchanges, reference)
    surface_family.fail(stop_regex, problems, len(exchanges), record_property)
