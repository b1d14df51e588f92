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

With transformers' own sampling of the sampled pairs as one wide call per group (issue #31: 5.1 s for the three
pairs, from 11.4), the assisted-sampling check (one generate call per request, transformers' assisted generation takes
one sequence at a time: 16-19 s, the largest single check) would leave the sglang process the longer one by ~10 s
(0.5.17: contract ~15 s + 17 s, against ~21 s). So the processes swap: the sglang process runs the checks that read
the greedy chains with and without the assistant (the ``generations`` fixture: greedy equals greedy on every pair
variant, the constructed rule, the witness's and the decoy's acceptance in transformers; ~11 s, every pair variant
whole, so each pair's chains are generated in one process), and the reference process keeps the sampled checks,
the witness ablations and the configs. The witness and decoy pairs are then loaded in both processes (~0.1 s each).

The long witness's assisted generation (tests/tiers/test_reference_long_witness.py, issue #38: ~0.7 CPU s, three
generate calls to the context limit) joins them, the same kind of check, so the long witness's checks (~3.2 CPU s
in all, 0.5.17, row_floor_bench.py) do not all land in the reference process.

The pytest plugin marks them ``SHARED_MARK`` at collection; the groups' ``-m`` expressions select by it. Plain
(no pytest import): the runner reads the names too.
"""

from __future__ import annotations

SHARED_MARK = "shared_reference"
SHARED_TIER = "reference"
# the checks that read tests/tiers/test_reference.py's ``generations`` (every parameter of each), and the long
# witness's assisted generation
SHARED_FUNCTIONS = (
    "test_greedy_with_assistant_equals_greedy",
    "test_constructed_rule_and_acceptance",
    "test_witness_drafts_at_transformers_phase",
    "test_decoy_chain_meets_prediction_in_transformers",
    "test_long_witness_assisted_equals_greedy",
)


def shared_check(tier: str | None, nodeid: str) -> bool:
    """Whether the check ``nodeid`` (``file::function[param]``) of ``tier`` runs in the side-by-side sglang process."""
    if tier != SHARED_TIER:
        return False
    return nodeid.rsplit("::", 1)[-1].partition("[")[0] in SHARED_FUNCTIONS
