"""Smoke tier, request family "streaming" (mtpmatrix.tiers.surface.streaming): streamed answers and the OpenAI-compatible endpoints."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import streaming

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if streaming.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_streaming_as_predicted(smoke_runs, name, record_property):
    """On every witness server: /generate streamed events extend each other and end at the plain answer (ids, text, completion_tokens, every spec_* field); /v1/completions text (streamed deltas joined, and not) equals /generate's text with usage.completion_tokens equal; /v1/chat/completions streamed deltas equal the unstreamed content, usage equal."""
    run, exchanges = surface_family.exchanges(streaming, smoke_runs, name, record_property)
    problems = streaming.own_problems(exchanges)
    surface_family.fail(streaming, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_streaming_match_no_mtp(smoke_runs, name, record_property):
    """Every streaming and OpenAI answer on an MTP witness server equals the witness without MTP's (text and ids)."""
    reference = surface_family.reference(streaming, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(streaming, smoke_runs, name, record_property)
    problems = streaming.against_reference(exchanges, reference)
    surface_family.fail(streaming, problems, len(exchanges), record_property)
