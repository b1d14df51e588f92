"""sglang's measured sliding-window deviations as the long witness reads them (issue #38; H200, 2026-12-05): which read
pattern of a served output, on which server, is which known-upstream deviation, and the phrase a check's failure
then carries (the phrase its known-upstream entry matches). Every function takes the reads ``long_witness.read_kinds``
names per token; none excuses a pattern the measurement and the source reading did not show.
"""

from __future__ import annotations

from mtpmatrix.core import settings
from mtpmatrix.pairs import long_witness
from mtpmatrix.tiers.compat import meta_fields

# What a long request's failure says when its output is one of sglang's measured Triton sliding-window deviations,
# each the phrase its known-upstream entry matches: a no-MTP server's decode one key short (``decode_reads_short``;
# sglang-triton-swa-decode-window-one-short), a topk > 1 server's tree verify windowed by node index
# (``tree_reads_short``; sglang-triton-swa-tree-verify-window-by-index).
DECODE_SHORT = "decodes with the sliding window one key short"
TREE_SHORT = "verifies tree nodes through sliding windows short by their index past their depth"
KNOWN_READS = (DECODE_SHORT, TREE_SHORT)


def decode_reads_short(kinds: str, retractions: int) -> bool:
    """Whether a no-MTP output's reads (long_witness.read_kinds) are what sglang's Triton backend serves: the prefill's
    token read at the window's edge, every decode token through a window one key short (update_sliding_window_buffer
    keeps min(seq_len, sliding_window_size) keys; its extend kernel and transformers keep one more: sglang#32087,
    issue #34354; read in 0.5.13, 0.5.17 and 0.5.23), but for at most one token per retraction (a re-prefill reads
    the edge again, once: never two in a row), and at least one token that the short window changes. No token any
    other read gives."""
    if not _only_edge_or_short(kinds):
        return False
    edge = (long_witness.READ_RULE, long_witness.READ_BOTH)
    rule = long_witness.READ_RULE
    # a re-prefill reads the edge once, then decode reads short again: two edge reads in a row are no re-prefill
    return kinds[0] in edge and kinds[1:].count(rule) <= retractions and rule * 2 not in kinds[1:]


def _only_edge_or_short(kinds: str) -> bool:
    """Every token the edge's read or the short window's, and at least one the short window's alone."""
    allowed = {long_witness.READ_RULE, long_witness.READ_BOTH, long_witness.READ_SHORT}
    return bool(kinds) and set(kinds) <= allowed and long_witness.READ_SHORT in kinds


def tree_reads_short(kinds: str) -> bool:
    """Whether an MTP output's reads (topk > 1) are what sglang's Triton extend kernel serves for a draft tree: it
    windows each node's prefix by the node's index in the flattened tree, not its depth (extend_attention.py's prefix
    stage: q_id = prefix_len + cur_m; read in 0.5.17; sglang PR #39287, open), so a node whose index is past its depth
    reads through a window short by the difference (every such window ends at 51..62 back, whose best read is 51).
    The root (index 0) and its top child (index 1, the drafter's first choice) are right: every verify step keeps at
    least two of the rule's tokens before the one it reads short (the step's bonus). So: the prefill's token at the
    edge, no token any other read gives, at least one short read, and at least two tokens that are not before each."""
    edge = (long_witness.READ_RULE, long_witness.READ_BOTH)
    if not _only_edge_or_short(kinds) or kinds[0] not in edge:
        return False
    return all(len(run) >= 2 for run in kinds.split(long_witness.READ_SHORT)[:-1])


def tree_counters(meta: dict, kinds: str) -> bool:
    """Whether a request's own counters are the tree verify's windows by index (``tree_reads_short``): every verify
    step kept the root's and its top child's drafts and none past the depth-3 node (the depth-2 node's index is past
    its depth, unless it is the only depth-1 node's child: measured [0, 0, 25, 1] and [0, 0, 24, 2]), most of them
    two, and no more short reads than verify steps (one bonus a step)."""
    hist = meta.get("spec_correct_drafts_histogram")
    verify, completion = meta.get("spec_verify_ct"), meta.get("completion_tokens")
    if not isinstance(hist, list) or not isinstance(verify, int) or not isinstance(completion, int) or len(hist) < 3:
        return False
    kept = sum(k * h for k, h in enumerate(hist)) + verify  # tokens the steps kept: drafts and a bonus each
    low = meta_fields.verified_tokens(completion, meta_fields.retractions_of(meta))
    return (
        verify >= 1
        and not any(hist[:2])
        and not any(hist[4:])
        and hist[2] >= sum(hist[3:4])
        and sum(hist) == verify
        and low <= kept <= completion - 1 + settings.NUM_STEPS  # the tail rule: the counters are the output's
        and kinds.count(long_witness.READ_SHORT) <= verify
    )


def known_reads(kinds: str, topk: int | None, meta: dict) -> str | None:
    """The known deviation (a KNOWN_READS phrase) an output's reads are, on a server of ``topk``, given its answer's
    meta_info (retractions; at topk > 1 the verify counters too); None for any other."""
    if not topk:
        return DECODE_SHORT if decode_reads_short(kinds, meta_fields.retractions_of(meta)) else None
    return TREE_SHORT if topk > 1 and tree_reads_short(kinds) and tree_counters(meta, kinds) else None


def known_last(problems: list[str]) -> list[str]:
    """``problems`` with the known deviations' (KNOWN_READS) after every other: a check's failure names its first
    problem, so it names a known deviation only when nothing else is wrong."""
    return sorted(problems, key=lambda p: any(k in p for k in KNOWN_READS))
