"""Smoke tier, request family "token_ids_logprob" (mtpmatrix.tiers.surface.token_ids_logprob): logprobs of chosen token ids in a batch where every request asks, then in a mixed batch."""

from __future__ import annotations

import pytest
import surface_family  # tests/tiers/surface_family.py: what these family checks share

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import token_ids_logprob

pytestmark = pytest.mark.smoke

SPECS = list(smoke_servers.collection_options().specs)
WITNESS = [s for s in SPECS if token_ids_logprob.requests(s, 512)]
WITNESS_MTP = [s for s in WITNESS if s.topk]


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_token_ids_logprob_as_predicted(smoke_runs, name, record_property):
    """Each token_ids_logprob request of the batch where every request asks: one entry per output position listing exactly the asked ids; the asked id that is the output there at >= logprobs.OWN_FLOOR, every other asked id <= -logprobs.GAP."""
    _own_problems(smoke_runs, name, record_property, token_ids_logprob.LAST_FIRST)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS])
def test_token_ids_logprob_beside_other_requests(smoke_runs, name, record_property):
    """The mixed batch: an asking request beside a top-logprob request and a plain one, each as predicted (the asking one as above; the top-logprob one as the logprobs family holds its own: top_logprobs_num entries a position, rank 1 the output at >= logprobs.OWN_FLOOR; neither other one gets output_token_ids_logprobs). Not compared with no-MTP: the batch that kills some releases' schedulers stays in this check alone. A release whose scheduler dies on it fails here alone (token_ids_logprob.LAST)."""
    _own_problems(smoke_runs, name, record_property, token_ids_logprob.MIXED)


def _own_problems(smoke_runs, name: str, record_property, labels) -> None:
    """The requests of ``labels`` on server ``name`` each as token_ids_logprob.own_problems predicts."""
    _run, exchanges = surface_family.exchanges(token_ids_logprob, smoke_runs, name, record_property, labels=labels)
    problems = [p for x in exchanges for p in token_ids_logprob.own_problems(x)]
    surface_family.fail(token_ids_logprob, problems, len(exchanges), record_property)


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", [s.name for s in WITNESS_MTP])
def test_token_ids_logprob_match_no_mtp(smoke_runs, name, record_property):
    """Each asked id's logprob at each position on an MTP witness server, in the batch where every request asks, within logprobs.TOLERANCE_NATS (0.656, bf16 bound derived in surface/logprobs.py) of the witness without MTP."""
    reference = surface_family.reference(token_ids_logprob, smoke_runs, record_property)
    _run, exchanges = surface_family.exchanges(
        token_ids_logprob, smoke_runs, name, record_property, labels=token_ids_logprob.LAST_FIRST
    )
    problems = token_ids_logprob.against_reference(exchanges, reference)
    surface_family.fail(token_ids_logprob, problems, len(exchanges), record_property)
