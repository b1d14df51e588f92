"""The speculative fields sglang puts in each response's ``meta_info``, by release, and how they must agree.

Every field comes from three per-request counters the scheduler keeps (``Req.spec_verify_ct``,
``Req.spec_num_correct_drafts``, ``Req.spec_correct_drafts_histogram``), bumped together once per verify step that
settles a request; the tokenizer manager (``_calculate_spec_decoding_metrics``) derives the rest:

* ``spec_verify_ct`` V: verify steps;
* ``spec_num_correct_drafts`` C: drafts accepted over those steps (bonus tokens not included);
* ``spec_correct_drafts_histogram`` H: H[k] = verify steps that accepted k drafts;
* ``spec_num_proposed_drafts`` = V * (speculative_num_draft_tokens - 1);
* ``spec_accept_rate`` = C / proposed; ``spec_accept_length`` = completion_tokens / V;
* 0.5.13-0.5.17 only: the aliases ``spec_accepted_drafts`` (= C), ``spec_proposed_drafts``, ``spec_accept_histogram``
  (= H), gone by 0.5.23.

Cited (installed sources; ``tokenizer_manager.py`` meta_info writes / the counters' one update site):
  0.5.13: tokenizer_manager.py:2295-2319; counters eagle_info.py:491-496 (the v1 verify Frozen-KV MTP runs on) and
          scheduler_components/batch_result_processor.py:570-574; histogram schedule_batch.py:1046-1056;
  0.5.17: tokenizer_manager.py:2765-2816; counters batch_result_processor.py:685-689;
  0.5.23: tokenizer_manager.py:3164-3207; counters batch_result_processor.py:832-836.
/server_info's ``avg_spec_accept_length`` (accepted tokens / verify steps, lifetime, per DP rank in internal_states):
  0.5.13 scheduler.py:3531, 0.5.17 scheduler.py:4198, 0.5.23 scheduler_components/internal_state.py:125.
Not checked: ``spec_cap_length``, ``spec_block_accept_length``, ``spec_cap_lens_histogram`` (0.5.17, 0.5.23), written
only in ragged-verify mode (``SGLANG_RAGGED_VERIFY_MODE``), which the tier does not run.

So, per request (N = completion_tokens, S = draft steps, R = num_retractions): sum(H) = V, sum(k * H[k]) = C, no
step accepts more than S drafts, and the *tail rule*: N counts the prefill token, one token per re-prefill after a
retraction at most (Req.reset_for_retract keeps the output; the re-prefill of prompt + output samples the next
token, no verify step: 0.5.13-0.5.23; a request retracted again before that token is kept adds none: 34 retractions
for 32 tokens on the H200, 0.5.17's topk 3 paged server, 2026-12-05) and every token the verify steps accepted
(C + V), except that the last step may accept up to S tokens past max_new_tokens, which the response drops, so
N - 1 - R <= C + V <= N - 1 + S (``verified_tokens`` is the lower end; the long family's exact counters,
surface.long_context.predicted_counters, stand on the same count). In aggregate, /server_info's avg_spec_accept_length must lie where the requests' counters put it
(``server_accept_outside``).
"""

from __future__ import annotations

import math

from mtpmatrix.serving.client import finish_type

CORE_FIELDS = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
ALIASES = {
    "spec_accepted_drafts": "spec_num_correct_drafts",
    "spec_proposed_drafts": "spec_num_proposed_drafts",
    "spec_accept_histogram": "spec_correct_drafts_histogram",
}  # alias -> the field it repeats
# sglang releases -> the speculative meta_info fields each response carries (after at least one verify step). Read
# in 0.5.13, 0.5.17 and 0.5.23 (citations above); 0.5.18-0.5.22 are unread, so they get the fields every read release
# has, which can only miss an alias, never demand one that is gone. A release outside every range: CORE_FIELDS.
SGLANG_META_FIELDS = (
    (">=0.5.13,<0.5.18", CORE_FIELDS + tuple(ALIASES)),
    (">=0.5.18,<0.5.24", CORE_FIELDS),
)
REL_TOL = 1e-6  # the ratios are one float division each, of small integers


def documented_fields(version: str | None = None) -> tuple[str, ...]:
    """The speculative meta_info fields sglang ``version`` (default: the installed one) writes per response."""
    from mtpmatrix.serving.environment import by_release, version_of

    return by_release(SGLANG_META_FIELDS, version or version_of("sglang"), CORE_FIELDS)


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=REL_TOL)


def verified_tokens(completion: int, retractions: int) -> int:
    """The fewest completion tokens a request's verify steps produced (the tail rule's N - 1 - R): all but the
    prefill's token and at most one per re-prefill after a retraction."""
    return completion - 1 - retractions


def retractions_of(meta: dict) -> int:
    """meta_info num_retractions (every release 0.5.13-0.5.23 writes it for a request the scheduler finished)."""
    r = meta.get("num_retractions", 0)
    return r if isinstance(r, int) and r >= 0 else 0


def aborted_in_queue(meta: dict) -> bool:
    """The answer sglang gives a request aborted in its waiting queue (tokenizer_manager._handle_abort_req,
    0.5.13 l. 2621-2664, 0.5.17 l. 3138 on, 0.5.23 l. 3577 on): finish "abort" without a status code (an abort for
    lack of memory carries 500) and none of the per-request fields only the scheduler's answer carries
    (num_retractions, cached_tokens, the speculative counters). Its completion_tokens count what the client was
    sent: 0 for a request never run (the long family's paged server aborts its victim there: H100, 0.5.17,
    2026-12-05f), more for one retracted into the queue after streaming."""
    reason = meta.get("finish_reason")
    return (
        finish_type(meta) == "abort"
        and "num_retractions" not in meta
        and not (isinstance(reason, dict) and reason.get("status_code"))
    )


def _queued_abort_fields(meta: dict, fields: tuple[str, ...]) -> list[str]:
    """A queued abort's answer carries no speculative field: one there is a miscount."""
    present = [f for f in fields if f in meta]
    return [f"{', '.join(present)} on an abort answered from the waiting queue"] if present else []


def _histogram_disagreements(hist: list[int], verify_steps: int, correct: int, steps: int) -> list[str]:
    """The histogram against the counters it must sum to: its steps, its accepted drafts, no step past ``steps``."""
    out = []
    if sum(hist) != verify_steps:
        out.append(f"histogram counts {sum(hist)} verify steps, spec_verify_ct {verify_steps}")
    weighted = sum(k * h for k, h in enumerate(hist))
    if weighted != correct:
        out.append(f"histogram accepts {weighted} drafts, spec_num_correct_drafts {correct}")
    if any(hist[steps + 1 :]):
        out.append(f"histogram has a step accepting more than {steps} drafts: {hist}")
    return out


def disagreements(meta: dict, *, fields: tuple[str, ...], draft_tokens: int, steps: int) -> list[str]:
    """What is wrong with one response's speculative fields (empty when they all agree); each item one phrase."""
    if aborted_in_queue(meta):
        return _queued_abort_fields(meta, fields)
    n = meta.get("completion_tokens")
    if not isinstance(n, int) or n < 1:
        return [f"completion_tokens is {n!r}"]
    v = meta.get("spec_verify_ct")
    if not v and n <= 1 + retractions_of(meta):
        # done at prefill and re-prefills (at most one token each): no verify step, no fields (the tokenizer manager
        # writes none; 0.5.13's topk 3 paged server, H200 2026-12-05: 32 tokens, no verify step, retracted on)
        return []
    missing = [f for f in fields if f not in meta]
    if missing:
        return [f"missing {', '.join(missing)} (completion_tokens {n})"]
    c, hist = meta["spec_num_correct_drafts"], meta["spec_correct_drafts_histogram"]
    out = []
    if not isinstance(v, int) or v < 1:
        return [f"spec_verify_ct {v!r} for {n} completion tokens"]
    if not _close(meta["spec_accept_length"], n / v):
        out.append(f"spec_accept_length {meta['spec_accept_length']} != completion_tokens/spec_verify_ct = {n}/{v}")
    proposed = v * (draft_tokens - 1)
    if meta["spec_num_proposed_drafts"] != proposed:
        out.append(
            f"spec_num_proposed_drafts {meta['spec_num_proposed_drafts']} != spec_verify_ct * "
            f"(draft tokens - 1) = {v} * {draft_tokens - 1}"
        )
    if proposed and not _close(meta["spec_accept_rate"], c / proposed):
        out.append(f"spec_accept_rate {meta['spec_accept_rate']} != correct/proposed drafts = {c}/{proposed}")
    for alias, original in ALIASES.items():
        if alias in fields and meta[alias] != meta[original]:
            out.append(f"{alias} {meta[alias]} != {original} {meta[original]}")
    if not isinstance(hist, list) or not all(isinstance(h, int) and h >= 0 for h in hist):
        return out + [f"spec_correct_drafts_histogram {hist!r} is not a list of counts"]
    out += _histogram_disagreements(hist, v, c, steps)
    r = retractions_of(meta)
    kept = verified_tokens(n, r)
    if not (kept <= c + v <= n - 1 + steps):
        out.append(
            f"accepted tokens (correct drafts + verify steps) {c} + {v} = {c + v} outside [{kept}, "
            f"{n - 1 + steps}], what {n} completion tokens after {r} retraction(s) allow (prefill token, at most one "
            f"per re-prefill, + accepted, the last step cut by at most {steps})"
        )
    return out


def server_accept_bounds(metas: list[dict], steps: int) -> tuple[float, float] | None:
    """Where /server_info's avg_spec_accept_length must lie given the requests' own counters.

    The server divides all tokens its verify steps accepted (drafts + bonus) by the number of verify steps. Each
    request's completion tokens are its prefill token, one per re-prefill after a retraction and what its verify
    steps accepted (``verified_tokens``), except that a request's last step may accept up to ``steps`` tokens past
    max_new_tokens (counted by the server, cut from the response). So the server's value lies in [sum(verified) / V,
    (sum(verified) + steps * requests) / V], V the requests' verify steps, and never above steps + 1. None when the
    requests ran no verify step.
    """
    verify = sum(m.get("spec_verify_ct", 0) or 0 for m in metas)
    if not verify:
        return None
    kept = sum(max(0, verified_tokens(m.get("completion_tokens", 0) or 0, retractions_of(m))) for m in metas)
    served = sum(max(0, (m.get("completion_tokens", 0) or 0) - 1) for m in metas)  # no re-prefill token at all
    lo = kept / verify
    hi = min(steps + 1.0, (served + steps * len(metas)) / verify)
    return round(lo, 4), round(hi, 4)


# Slack on those bounds: the server's average also counts sglang's own warm-up request at launch (a few tokens, one
# or two verify steps), which no response of the tier reports.
SERVER_BOUNDS_SLACK = 0.02


def server_accept_outside(metas: list[dict], avg: float, steps: int) -> str | None:
    """Why /server_info's avg_spec_accept_length ``avg`` disagrees with the requests' own counters
    (``server_accept_bounds``), or None when it agrees or the requests ran no verify step."""
    bounds = server_accept_bounds(metas, steps)
    if bounds and not (bounds[0] - SERVER_BOUNDS_SLACK <= avg <= bounds[1] + SERVER_BOUNDS_SLACK):
        return (
            f"/server_info avg_spec_accept_length {avg:.3f} outside [{bounds[0]}, {bounds[1]}], the range the "
            f"requests' own counters allow"
        )
    return None
