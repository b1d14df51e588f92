"""The draft phase, the witness's one free convention.

The *draft phase* is the draft query's RoPE position minus the RoPE position of the last accepted token's key. The
witness query peaks on the key ``phase`` positions before itself, so a witness drafts right only under the phase it
was built for:
  * transformers (the reference): ``SinglePositionMultiTokenCandidateGenerator`` puts the query at the bonus token's
    position ``input_ids.shape[1] - 1`` and the target's keys sit at 0-based positions: phase +1
    (``REFERENCE_DRAFT_PHASE``; the reference tier checks it with transformers' own assisted generation);
  * sglang 0.5.13-0.5.23 with a ``Gemma4ForConditionalGeneration`` target (every Gemma 4 checkpoint): the target
    writes its keys at position + 1 (``gemma4_mm.py``: ``positions += 1``) and the draft query sits at
    ``seq_lens - 1`` (``frozen_kv_mtp_utils.set_frozen_kv_positions``), so the last accepted key is one position
    *after* the query: phase -1 (``SGLANG_DRAFT_PHASES``, by release). Measured on an H200 (sglang 0.5.17) by dumping the draft
    forward's q and the target's frozen K: slot j's key carries RoPE position j + 1, the query seq_lens - 1.
Pair variants: ``witness`` is built for the reference phase, ``witness-sglang-phase`` for sglang's. The smoke tier
gates hand-offs with the sglang-phase witness and reports the phase difference itself with the reference witness
(``known_upstream.json``: sglang-gemma4-mtp-draft-rope-phase).
"""

from __future__ import annotations

import os

from mtpmatrix.core import schema

# Draft phase = the draft query's RoPE position minus that of the last accepted token's key (module docstring).
REFERENCE_DRAFT_PHASE = 1  # transformers: query at the bonus token's position, keys at 0-based positions
# sglang releases -> the draft phase they draft at (Gemma4ForConditionalGeneration target: keys at position + 1,
# query at seq_lens - 1). Measured on an H200 for 0.5.13 and 0.5.17; 0.5.23 has the same code. A release outside
# every range is expected at the reference phase: if it is not, the sglang-phase witness collapses and says so, and
# the range here (and in known_upstream.json) is what to extend.
SGLANG_DRAFT_PHASES = ((">=0.5.13,<=0.5.23", -1),)
DRAFT_PHASE_ENV = schema.DRAFT_PHASE_ENV


def sglang_draft_phase(version: str | None = None) -> int:
    """The draft phase of sglang ``version`` (default: the installed one; without sglang, the newest measured). A
    candidate that moves the phase declares it (MTPMATRIX_DRAFT_PHASE, runner/candidate.py): the installed sglang is
    then no release this table knows, and the evidence judge accepts the knob only beside the same declaration in the
    candidate's record."""
    from mtpmatrix.serving.environment import by_release, version_of

    declared = os.environ.get(DRAFT_PHASE_ENV, "").strip()
    if declared and version is None:
        try:
            return int(declared)
        except ValueError:
            raise ValueError(f"{DRAFT_PHASE_ENV}={declared!r}: not a whole number (e.g. +1)") from None
    version = version or version_of("sglang")
    if not version:
        return SGLANG_DRAFT_PHASES[-1][1]
    return by_release(SGLANG_DRAFT_PHASES, version, REFERENCE_DRAFT_PHASE)


def phase_of_variant(variant: str) -> int:
    """The draft phase a witness pair variant's assistant is built for: ``witness`` / ``decoy`` transformers', the
    ``*-sglang-phase`` ones the installed sglang's."""
    return sglang_draft_phase() if variant.endswith("-sglang-phase") else REFERENCE_DRAFT_PHASE
