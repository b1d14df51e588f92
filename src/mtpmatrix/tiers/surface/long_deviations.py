"""sglang's measured sliding-window deviations as the long witness reads them (issue #38; H200, 2026-12-05): which read
pattern of a served output, on which server, is which known-upstream deviation, and the phrase a check's failure
then carries (the phrase its known-upstream entry matches). Every function takes the reads of each token
(``long_witness.read_kinds``' letters, or ``Reads``: every read a token fits); none excuses a pattern the measurement
and the source reading did not show.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.pairs import long_witness
from mtpmatrix.tiers.compat import meta_fields

# What a long request's failure says when its output is one of sglang's measured Triton sliding-window deviations,
# each the phrase its known-upstream entry matches: a no-MTP server's decode one key short (``decode_reads_short``;
# sglang-triton-swa-decode-window-one-short), a topk > 1 server's tree verify windowed by node index
# (``tree_reads_short``; sglang-triton-swa-tree-verify-window-by-index), sglang 0.5.13's extend rows one key wide
# (``extend_reads_wide``; sglang-0513-gemma4-swa-extend-window-one-wide).
DECODE_SHORT = "decodes with the sliding window one key short"
TREE_SHORT = "verifies tree nodes through sliding windows short by their index past their depth"
EXTEND_WIDE = "extends with the sliding window one key wide"
KNOWN_READS = (DECODE_SHORT, TREE_SHORT, EXTEND_WIDE)
EDGE, SHORT, WIDE = long_witness.READ_RULE, long_witness.READ_SHORT, long_witness.READ_WIDE
# The most split states extend_reads_wide tries before it gives up (the output is then not excused): every output
# 0.5.13 served settled within 60 (H200, 2026-12-05); tokens that fit every read, no split found and a histogram
# over five bins took 13.7 s unbounded (the states grow with the histogram's bins and the retractions).
SPLITS_LIMIT = 20_000


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


# Drafts a verify step keeps under the tree windows by index where each node reads through its own window: the root's,
# its top child's (index 1, depth 1) and the depth-2 node's when it is the only depth-1 node's child (index 2).
TREE_MAX_DRAFTS = 3


def tree_counters(meta: dict, kinds: str, after: str = "") -> bool:
    """Whether a request's own counters are the tree verify's windows by index (``tree_reads_short``): every verify
    step kept the root's and its top child's drafts (the depth-2 node's index is past its depth, unless it is the
    only depth-1 node's child: measured [0, 0, 25, 1] and [0, 0, 24, 2]), most of them two, and no more short reads
    than verify steps (one bonus a step). A node deeper than that reads through a window short by its index, so a
    draft it verifies is kept only where the short read gives the rule's token too (READ_BOTH): every draft a step
    kept past TREE_MAX_DRAFTS is one such token, in the output or among ``after`` (the rule's tokens past it, which a
    step the limit cut may have kept). Measured: [0, 0, 25, 0, 1] with its four-draft step's third and fourth
    tokens read both ways (H200, 0.5.17, 2026-12-05d, the limit request retracted once)."""
    hist = meta.get("spec_correct_drafts_histogram")
    verify, completion = meta.get("spec_verify_ct"), meta.get("completion_tokens")
    if not isinstance(hist, list) or not isinstance(verify, int) or not isinstance(completion, int) or len(hist) < 3:
        return False
    drafts = sum(k * h for k, h in enumerate(hist))
    kept = drafts + verify  # tokens the steps kept: drafts and a bonus each
    low = meta_fields.verified_tokens(completion, meta_fields.retractions_of(meta))
    past_cut = after[: settings.NUM_STEPS].count(long_witness.READ_BOTH)
    both_ways = kinds.count(long_witness.READ_BOTH) + past_cut
    deep = sum((k - TREE_MAX_DRAFTS) * h for k, h in enumerate(hist) if k > TREE_MAX_DRAFTS)
    return (
        verify >= 1
        and not any(hist[:2])
        and hist[2] >= sum(hist[3:])
        and deep <= both_ways
        and sum(hist) == verify
        and meta.get("spec_num_correct_drafts", drafts) == drafts  # the accepted drafts are the histogram's
        # the counters are the output's: every step's tokens in it but the last's, which the limit may cut after
        # its first token (at most TREE_MAX_DRAFTS past the output, and a draft read both ways past it each more)
        and low <= kept <= completion - 1 + TREE_MAX_DRAFTS + past_cut
        and kinds.count(long_witness.READ_SHORT) <= verify
    )


class Reads(NamedTuple):
    """What a served long output is made of, as the deviations need it: each token's reads (long_witness.read_sets),
    the reads of the rule's next NUM_STEPS tokens past it (what a verify step the limit cut would have kept: its
    drafts are the rule's) and the prompt's length (which row of its segment a prefill's last token is)."""

    tokens: list[str]
    after: list[str]
    prompt_len: int

    @property
    def kinds(self) -> str:
        """One letter a token (long_witness.read_kinds' alphabet), what the 0.5.17 signatures read."""
        return long_witness.kinds_of(self.tokens)


def served_reads(prompt: list[int], output: list[int], text: dict) -> Reads:
    """The ``Reads`` of ``output`` served for ``prompt`` by the long witness whose text config is ``text``."""
    ids = list(prompt) + list(output)
    try:
        rule = long_witness.expected_continuation(ids, len(ids) + settings.NUM_STEPS, text["sliding_window"])
    except ValueError:  # another group's key token in the output: the rule goes no further
        rule = []
    tokens = long_witness.read_sets(prompt, output, text)
    return Reads(tokens, long_witness.read_sets(ids, rule, text) if rule else [], len(prompt))


def extend_reads_wide(reads: Reads, topk: int | None, meta: dict) -> bool:
    """Whether an output's reads are what sglang 0.5.13 serves: its Gemma 4 layers hand RadixAttention
    config.sliding_window (gemma4_causal.py: 64) where the Triton backend builds its window buffers from
    sliding_window - 1 (63 keys), so the extend kernel's mask (q <= k + 64) admits one key too many for every extend
    row but a segment's first, which the 63-key buffer holds to the edge (fixed in 0.5.14, sglang PR #26147). So:
      * a (re-)prefill's token, the last row of its last chunk, reads one key wide, or the edge where that chunk is
        one row (``_prefill_read``); at most one re-prefill token per retraction;
      * no MTP: every other token decodes one key short (decode_reads_short's deviation, in 0.5.13 too);
      * MTP: the rest splits into verify steps of exactly the answer's own histogram, whose counters agree with it
        (``_counters``); each step's root (its first row) reads the edge and keeps the drafter's first draft; at
        topk 1 every node below it reads one key wide, so a step keeps the drafts that read the same either way and
        ends at the first that does not, a step the limit cut included (``_step_fits``); at topk > 1 the top child
        reads one key wide and the nodes past it through windows their flattened index sets (any of the three
        reads: there a draft lost past depth 1 looks like a sibling not matched, the signature cannot tell).
    At least one token the edge's read does not give."""
    tokens = reads.tokens
    # the prefill's own last chunk is however many rows the batch's shared chunk budget left it: the edge or one wide
    if not tokens or all(EDGE in r for r in tokens) or not (EDGE in tokens[0] or WIDE in tokens[0]):
        return False
    retractions = meta_fields.retractions_of(meta)
    if not topk:
        re_prefills = [j for j, r in enumerate(tokens) if j and SHORT not in r]
        return len(re_prefills) <= retractions and all(_prefill_read(reads, j) for j in re_prefills)
    if not meta.get("spec_verify_ct") and len(tokens) <= 1 + retractions:  # made by prefills alone: no verify step
        return _prefills_only(meta, len(tokens)) and all(_prefill_read(reads, j) for j in range(1, len(tokens)))
    hist = _counters(meta, len(tokens))
    return hist is not None and _steps_fit(reads, topk, retractions, hist)


def _prefill_read(reads: Reads, j: int) -> bool:
    """Whether token ``j`` (j >= 1) is what a re-prefill of the ``prompt_len + j`` tokens before it reads on 0.5.13:
    one key wide from its last chunk's second row on, the edge where that chunk is one row. A retracted request's KV
    is not cached (release_kv_cache(is_insert=False)), so its re-prefill recomputes all of them, chunked from the
    start; the H200 showed re-prefills of 161 tokens (5 x 32 + 1) reading the edge, the others one key wide. Not
    allowed for: a chunk budget a neighbour in the same prefill batch shares, which may cut the last chunk elsewhere
    (refused: a visible failure, never a hidden one)."""
    one_row = (reads.prompt_len + j) % smoke_servers.LONG_CHUNK == 1
    return WIDE in reads.tokens[j] or (one_row and EDGE in reads.tokens[j])


def _prefills_only(meta: dict, completion: int) -> bool:
    """Whether an answer's counters say no verify step ran: its completion tokens the output's, no accepted draft."""
    hist = meta.get("spec_correct_drafts_histogram")
    return (
        meta.get("completion_tokens") == completion
        and not meta.get("spec_num_correct_drafts")
        and (hist is None or (isinstance(hist, list) and not any(hist)))
    )


def _counters(meta: dict, completion: int) -> tuple[int, ...] | None:
    """The answer's histogram of accepted drafts per verify step, NUM_STEPS + 1 bins, where its counters agree with
    it and with the output (verify steps and completion tokens reported and equal; accepted drafts where reported; no
    step keeping none); None otherwise."""
    steps = settings.NUM_STEPS
    hist = meta.get("spec_correct_drafts_histogram")
    if not isinstance(hist, list) or not all(isinstance(h, int) and h >= 0 for h in hist):
        return None
    if any(hist[:1]) or any(hist[steps + 1 :]) or meta.get("completion_tokens") != completion:
        return None
    if meta.get("spec_verify_ct") != sum(hist):
        return None
    if meta.get("spec_num_correct_drafts", sum(k * h for k, h in enumerate(hist))) != sum(
        k * h for k, h in enumerate(hist)
    ):
        return None
    return tuple(hist[: steps + 1]) + (0,) * (steps + 1 - len(hist))


def _steps_fit(reads: Reads, topk: int, retractions: int, hist: tuple[int, ...]) -> bool:
    """Whether the tokens past the prefill's split into at most ``retractions`` re-prefill tokens and verify steps of
    exactly ``hist``'s counts of accepted drafts, each step as ``_step_fits`` says."""
    tokens = tuple(reads.tokens)
    budget = [SPLITS_LIMIT]

    @cache
    def fits(pos: int, re_prefills: int, left: tuple[int, ...]) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManySplits
        if pos == len(tokens):
            return not any(left)
        if re_prefills < retractions and _prefill_read(reads, pos) and fits(pos + 1, re_prefills + 1, left):
            return True
        for accepted in range(1, len(left)):
            end = pos + accepted + 1
            if not left[accepted]:
                continue
            rest = left[:accepted] + (left[accepted] - 1,) + left[accepted + 1 :]
            cut = tuple(reads.after[: end - len(tokens)]) if end > len(tokens) else ()
            if end > len(tokens) and (any(rest) or len(cut) < end - len(tokens)):
                continue  # only the last step can be cut, by no more than the rule's continuation shows
            if not _step_fits(tokens[pos:end] + cut, accepted, topk, shown=len(tokens[pos:end])):
                continue
            if end > len(tokens) or fits(end, re_prefills, rest):
                return True
        return False

    try:
        return fits(1, 0, hist)
    except _TooManySplits:
        return False


class _TooManySplits(Exception):
    """``_steps_fit`` gave up: an output it cannot settle within SPLITS_LIMIT states is not excused."""


def _step_fits(tokens: tuple[str, ...], accepted: int, topk: int, shown: int) -> bool:
    """One verify step's ``accepted`` + 1 tokens as 0.5.13 reads them, the first ``shown`` served and the rest (a step
    the limit cut) the reads of the rule's continuation (the drafts it kept are the rule's): the root's at the edge
    (the drafter's first draft, kept); at topk 1 each next node one key wide, a kept draft the edge's too, the bonus
    not (else its draft would be kept) unless every draft was; at topk > 1 the top child's one key wide, the rest any
    of the three reads (a cut one unchecked: which sibling it matched is not known)."""
    if EDGE not in tokens[0] or (shown > 1 and WIDE not in tokens[1]):
        return False
    if topk > 1:
        return all(tokens[:shown])
    bonus = tokens[accepted]
    if not all(EDGE in t and WIDE in t for t in tokens[1:accepted]):  # the kept drafts: both reads give them
        return False
    if accepted == settings.NUM_STEPS:
        return accepted >= shown or WIDE in bonus
    if accepted >= shown:  # the bonus was cut: its node read one key wide where the rule's token is not that read
        return WIDE not in bonus
    return WIDE in bonus and EDGE not in bonus


def known_reads(reads: Reads, topk: int | None, meta: dict) -> str | None:
    """The known deviation (a KNOWN_READS phrase) an output's reads are, on a server of ``topk``, given its answer's
    meta_info (retractions; on MTP servers the verify counters too); None for any other. The 0.5.17 patterns first:
    an output both could be (its prefill's token the same read at the edge and one key wide) is the decode's, in
    0.5.13 as well."""
    kinds = reads.kinds
    if not topk and decode_reads_short(kinds, meta_fields.retractions_of(meta)):
        return DECODE_SHORT
    if topk and topk > 1 and tree_reads_short(kinds) and tree_counters(meta, kinds, long_witness.kinds_of(reads.after)):
        return TREE_SHORT
    return EXTEND_WIDE if extend_reads_wide(reads, topk, meta) else None


# Deviations of one release each (TREE_SHORT: 0.5.17; EXTEND_WIDE: 0.5.13), where DECODE_SHORT is every release's:
# a check names the one release's first, so an entry of the release under test matches only where it explains that
MIXED_RELEASES = "the outputs read as two releases' deviations at once (0.5.17's tree and 0.5.13's extend)"


def known_last(problems: list[str]) -> list[str]:
    """``problems`` with the known deviations' (KNOWN_READS) after every other: a check's failure names its first
    problem, so it names a known deviation only when nothing else is wrong. Among them one release's own
    (TREE_SHORT, EXTEND_WIDE) before the decode's, which more releases share; both releases' own at once is no
    release's (MIXED_RELEASES first)."""
    own = (TREE_SHORT, EXTEND_WIDE)

    def rank(problem: str) -> int:
        return 0 if not any(k in problem for k in KNOWN_READS) else 1 if any(k in problem for k in own) else 2

    ordered = sorted(problems, key=rank)
    mixed = all(any(k in p for p in problems) for k in own)
    return [MIXED_RELEASES, *ordered] if mixed else ordered
