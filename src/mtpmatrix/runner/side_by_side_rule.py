"""Which reference checks the side-by-side sglang process runs (mtpmatrix.runner.side_by_side), as a pytest marker.

Why: run whole, the reference tier's process is the suite's critical path on a CPU row (about twice the contract
tier's), so the sglang process, idle after its contract tier, takes a share of it. The share is the checks of the
sglang-phase witness and decoy pairs: a stable rule on node ids, about a quarter of the tier's time, and whole pair
variants, so a pair's session-cached load stays in one process (and is built and loaded once, as in one process).

The pytest plugin marks them ``SHARED_MARK`` at collection; the groups' ``-m`` expressions select by it. Plain
(no pytest import): the runner reads the names too.
"""

from __future__ import annotations

SHARED_MARK = "shared_reference"
SHARED_TIER = "reference"
SHARED_VARIANT_SUFFIX = "-sglang-phase]"  # node ids like test_x[e-series-witness-sglang-phase]


def shared_check(tier: str | None, nodeid: str) -> bool:
    """Whether the check ``nodeid`` of ``tier`` runs in the side-by-side sglang process."""
    return tier == SHARED_TIER and nodeid.endswith(SHARED_VARIANT_SUFFIX)
