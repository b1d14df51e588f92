"""Which smoke servers a mutant's suite launches: the groups that see each kind of bug (the servers themselves are
defined once, in ``mtpmatrix.core.smoke_servers``)."""

from mtpmatrix.core.smoke_servers import DECOY_SERVERS, LONG_SERVERS, SAMPLED_SERVERS, WITNESS_SERVERS
from mtpmatrix.faults.mutation import DEFAULT_SERVERS

__all__ = ["DEFAULT_SERVERS", "WITNESS_SERVERS"]

TOPK1, TOPK3 = (WITNESS_SERVERS[0],), (WITNESS_SERVERS[1],)
# Smoke servers that see what the witness cannot: the decoy witness (greedy; the drafter ranks a wrong decoy first at
# known inputs, so verify must reject it and, at topk 3, the accepted path runs through non-first branches) and the
# sampled pair (temperature, top-k, top-p; a closed-form target distribution). Defined once, in smoke.
DECOY_TOPK1, DECOY_TOPK3 = (DECOY_SERVERS[0],), (DECOY_SERVERS[1],)
SAMPLED_MTP = SAMPLED_SERVERS

# Smoke servers the request-surface mutants need (smoke_servers.SMOKE_SERVERS; tests/unit/test_catalogue_surface.py checks
# the names): the no-MTP references that the MTP-equals-no-MTP checks compare with, and the servers of a mode no
# other server runs (non-overlap scheduler, eager draft path), each beside its default-mode twin so that one suite
# shows the mode's checks failing while the same checks on the default server pass.
WITNESS_NOMTP, SAMPLED_NOMTP = "witness-nomtp", "sampled-nomtp"
WITNESS_SURFACE = WITNESS_SERVERS + (WITNESS_NOMTP,)
DECOY_NO_OVERLAP = ("decoy-mtp-topk3-no-overlap", DECOY_SERVERS[1])
WITNESS_EAGER = ("witness-mtp-topk3-eager", WITNESS_SERVERS[1])

# The long-and-tight family (tests/tiers/test_smoke_long.py): the no-MTP twin beside both MTP servers, so that one
# suite shows the MTP servers' checks failing while the same checks on the twin pass.
LONG = LONG_SERVERS
