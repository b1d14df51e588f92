"""Which reference checks the side-by-side sglang process runs (mtpmatrix.runner.side_by_side), as a pytest marker.

Why: run whole, the reference tier's process is the suite's critical path on a CPU row (warm 0.5.17: 42.9 s against
the sglang process's 28.7 s), so the sglang process, idle after its contract tier, takes a share of it. The share is
the checks of one pair variant, the dense-31b sampled pair (``test_sampled_*`` with that pair's id, and the one
unparametrized sampled check, which loads that pair): about 9.5 s, near half the gap, and a whole variant, so its
session-cached load (tests/tiers/test_reference.py ``load_pair``) happens in one process. Were a check of another
pair to match, it would only load that pair twice: which process runs a check never changes its record.

Forked from one interpreter that has imported torch and transformers (mtpmatrix.tiers.session.fork), the reference
process no longer imports them, and the sglang process, its imports compiled ahead, ends ~5 s before it (0.5.17:
sessions 14.8 / 19.6 s), so it took a second variant: the moe-26b-a4b sampled pair's checks (~2.4 s).

With the reference tier's model work batched (issue #31: the witness ablations stacked, one generation per pair, the
plain chains batched), the reference process went from the longer to the shorter one (ci row 0.5.17, contended box:
sglang process 15.1 s contract + 18.1 s assisted sampling + 7.6 s two sampled pairs' transformers sampling, against
~26 s), so the share is the one unparametrized check alone, transformers' assisted sampling (its dense-31b sampled
pair then loads in both processes, ~0.1 s): about 33 s each.

The pytest plugin marks them ``SHARED_MARK`` at collection; the groups' ``-m`` expressions select by it. Plain
(no pytest import): the runner reads the names too.
"""

from __future__ import annotations

SHARED_MARK = "shared_reference"
SHARED_TIER = "reference"
SHARED_FUNCTION_PREFIX = "test_sampled_"
# None: test_sampled_assisted_generation_matches_closed_form (dense-31b's pair)
SHARED_PARAMS = (None,)


def shared_check(tier: str | None, nodeid: str) -> bool:
    """Whether the check ``nodeid`` (``file::function[param]``) of ``tier`` runs in the side-by-side sglang process."""
    if tier != SHARED_TIER:
        return False
    name = nodeid.rsplit("::", 1)[-1]
    function, _, param = name.partition("[")
    return function.startswith(SHARED_FUNCTION_PREFIX) and (param.removesuffix("]") or None) in SHARED_PARAMS
