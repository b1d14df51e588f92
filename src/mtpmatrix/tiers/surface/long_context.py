"""Request family "long_context": the long-and-tight servers (issue #38 item 2) on the long witness.

The long witness (mtpmatrix.pairs.long_witness) decides every token past position 64 by a read at the window's far
edge and a key token far outside it, so its greedy output is known exactly (``expected_continuation``) however a
server chunks, caches, retracts or batches. The servers (smoke_servers.LONG_SERVERS) run a 640-token pool, 32-token
prefill chunks and, at topk 3, 16-token pages. The family sends them:

  limit-<i>      4 prompts of 160 tokens (2.5 windows, 5 prefill chunks) asking for the most new tokens sglang
                 admits (``admitted_new``), in one batch: sglang's admission runs two at a time on the 640-token
                 pool (see abort below) and the pair may retract near the end, so the scheduler queues and retracts;
  over-limit     one token more than that: sglang must refuse it (tokenizer_manager._validate_one_request);
  prefix-first, prefix-repeat
                 (alone, in this order) two prompts sharing their first 100 tokens (over 1.5 windows), tails
                 differing from their first token: the repeat must hit the radix cache for the shared prefix
                 (meta_info cached_tokens, ``cached_bounds``);
  abort          (alone) client.AbortMidBatch: a neighbour and then (once it has a token) a victim, prompts of 160
                 tokens to the limit, streamed; once both have streamed a token and neither has finished (on the
                 paged server also once the victim waits queued), /abort_request for the victim.
                 The neighbour must come out exact, the victim must end "abort" with a prefix of its rule output.
                 Two, not more: sglang admits a request only while input + max_new_tokens + page stays under the pool
                 left after what the running ones hold and may still write (schedule_policy PrefillAdder.add_one_req,
                 0.5.13-0.5.23), so of 160-token requests to the limit on a 640-token pool two run at once (2 x 255)
                 and a third waits for one to finish: with more, a request always finished before the last one had
                 a token, and the abort was never sent mid-batch. On the 16-page topk 3 server under the spec-v2
                 worker (0.5.17, 0.5.23) even two cannot decode together (each reserves 2 x 96 draft slots per decode,
                 mem_cache allocation_sizing.get_alloc_reserve_per_decode), so the later one is retracted at its first
                 decode and the abort finds the victim in the waiting queue: sglang then answers the stream with
                 only its last token and no counters (tokenizer_manager._handle_abort_req; serving.abort rebuilds
                 the ids from the stream, ``accept_metas`` leaves that answer out).

Acceptance (``accept_problems``): the long witness's drafter reads the target's frozen KV at positions derived from
the last accepted token and drafts every token right (pairs/long_witness.py), so on an intact MTP server every verify
step accepts all its drafts, whatever chunking, caching or retraction the request went through: each request's
meta_info counters are exact (``predicted_counters``). Drafts lost on exactly this family's paths (the first round
after a chunked prefill or a radix hit, 16-token pages, near the context limit) leave every output exact; only these
counters see them.

Lengths, from sglang's code (0.5.13-0.5.23): the tokenizer refuses input + R + max_new_tokens > context_len, R the
slots it reserves for drafts (tokenizer_manager num_reserved_tokens: max(topk x num_steps, draft tokens) under
speculative decoding, else 0); the scheduler then clamps max_new_tokens to max_req_len - input - 1 with max_req_len
= context_len - 1 (scheduler.py, before the pool bound, which these servers' pool leaves slack for). So a request
asking ``admitted_new`` finishes "length" after ``limit_new`` tokens: prompt + output = context_len - 2 without MTP
(254), context_len - R with MTP (250 at topk 1, 241 at topk 3).
"""

from __future__ import annotations

import re

from mtpmatrix.core import settings
from mtpmatrix.core.smoke_servers import LONG_CONTEXT_LEN, page_size
from mtpmatrix.pairs import long_witness
from mtpmatrix.serving.abort import AbortMidBatch, finished_before_abort
from mtpmatrix.serving.client import Call, finish_type
from mtpmatrix.tiers.compat import meta_fields
from mtpmatrix.tiers.surface import both_answered, reference_gaps
from mtpmatrix.tiers.surface.long_deviations import (
    EXTEND_WIDE,
    TREE_SHORT,
    known_last,
    known_reads,
    served_reads,
)

NAME = "long_context"
PAIR = "long-witness-sglang-phase"
REFERENCE_SERVER = "long-witness-nomtp"
WINDOW = 64  # the tiny configs' sliding_window (docs/pairs.md "Long witness")
PROMPT = 160
N_LIMIT = 4
SHARED, TAIL, PREFIX_NEW = 100, 20, 32
N_NEIGHBOURS = 1  # the abort group is 2 requests: what the pool lets run at once (module docstring)
ALONE = frozenset({"prefix-first", "prefix-repeat", "abort"})
# each group of prompts its own seed, so no two requests of the family share more than BOS and a key token
SEED_LIMIT, SEED_PREFIX, SEED_ABORT = 38, 39, 40


# sglang's scheduler log (0.5.13-0.5.23): a decode step that finds no room retracts ("Decode out of memory happened.
# #retracted_reqs: N, ..."); decode lines report the pools' use ("token usage: 0.42" / "full token usage: 0.42, swa
# token usage: 0.31"); the idle check (scheduler on_idle -> invariant_checker._report_leak) names a pool that did not
# come back to empty: "<pool> memory leak detected! ..." (raised under SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE,
# else logged as a warning).
RETRACTED_RE = re.compile(r"#retracted_reqs: (\d+)")
USAGE_RE = re.compile(r"\b(full |swa )?token usage: ([\d.]+)")
LEAK_RE = re.compile(r"memory leak detected!.*")


def pool_report(log_text: str) -> dict:
    """What the server log says of its pools: requests retracted, the peak use of each pool (a fraction), and every
    leak the idle check reported."""
    peaks: dict[str, float] = {}
    for kind, value in USAGE_RE.findall(log_text):
        key = (kind.strip() or "full") + "_token_usage_peak"
        peaks[key] = max(peaks.get(key, 0.0), float(value))
    return {
        "retracted_reqs": sum(int(n) for n in RETRACTED_RE.findall(log_text)),
        **peaks,
        "leaks": LEAK_RE.findall(log_text),
    }


def reserved(topk: int | None) -> int:
    """The slots sglang's tokenizer reserves per request for drafts (R above)."""
    return max(topk * settings.NUM_STEPS, settings.DRAFT_TOKENS[topk]) if topk else 0


def admitted_new(topk: int | None, prompt_len: int, context_len: int = LONG_CONTEXT_LEN) -> int:
    """The most max_new_tokens the tokenizer admits for a prompt of ``prompt_len`` tokens."""
    return context_len - reserved(topk) - prompt_len


def limit_new(topk: int | None, prompt_len: int, context_len: int = LONG_CONTEXT_LEN) -> int:
    """The tokens a request asking ``admitted_new`` gets: the scheduler's clamp to max_req_len - input - 1."""
    return min(admitted_new(topk, prompt_len, context_len), (context_len - 1) - prompt_len - 1)


def cached_bounds(shared: int, page: int, mtp: bool = False) -> tuple[int, int]:
    """What cached_tokens the repeat of a prefix pair may report: the shared prefix in whole pages (a radix tree of
    ``page``-token pages matches whole pages only) up to the whole shared prefix (the tails differ from their first
    token, so no longer match exists). Under MTP the tree's keys are token pairs: sglang counts Frozen-KV MTP as
    EAGLE (spec_info.is_eagle, 0.5.13-0.5.23), so the radix cache is built with is_eagle and matches bigram views of
    the keys (RadixKey.maybe_to_bigram_view; len = tokens - 1); the pair (t[shared - 1], t[shared]) differs, so at
    most ``shared - 1`` tokens match."""
    matchable = shared - 1 if mtp else shared
    return matchable // page * page, matchable


def _params(max_new: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}


def _prefix_prompts() -> tuple[list[int], list[int]]:
    a, b = long_witness.prompts(2, SHARED + TAIL, seed=SEED_PREFIX)
    b = a[:SHARED] + b[SHARED:]
    if b[SHARED] == a[SHARED]:  # the tails must differ at once: step the first tail token's member
        b[SHARED] = long_witness.body_token(0, (long_witness.member_of(a[SHARED]) + 1) % long_witness.CYCLE)
    return a, b


def requests(spec, vocab_size: int) -> list[tuple[str, dict | Call | AbortMidBatch]]:
    if spec.pair != PAIR:
        return []
    out: list = []
    new = admitted_new(spec.topk, PROMPT)
    for i, p in enumerate(long_witness.prompts(N_LIMIT, PROMPT, seed=SEED_LIMIT)):
        out.append((f"limit-{i}", {"input_ids": p, "sampling_params": _params(new)}))
    over = long_witness.prompts(1, PROMPT, seed=SEED_LIMIT + 100)[0]
    out.append(("over-limit", {"input_ids": over, "sampling_params": _params(new + 1)}))
    first, repeat = _prefix_prompts()
    out.append(("prefix-first", {"input_ids": first, "sampling_params": _params(PREFIX_NEW)}))
    out.append(("prefix-repeat", {"input_ids": repeat, "sampling_params": _params(PREFIX_NEW)}))
    group = long_witness.prompts(N_NEIGHBOURS + 1, PROMPT, seed=SEED_ABORT)
    bodies = [{"input_ids": p, "sampling_params": _params(new)} for p in group]
    victim = {**bodies[-1], "rid": f"{spec.name}-abort-victim"}
    out.append(("abort", AbortMidBatch(tuple(bodies[:-1]), victim, victim_may_queue=page_size(spec) > 1)))
    return out


def expected(prompt: list[int], n: int) -> list[int]:
    return long_witness.expected_continuation(prompt, len(prompt) + n, WINDOW)


def pair_text(family: str = "e-series") -> dict:
    """The long witness's target text config (its window and sliding RoPE decide every read; the same in every
    family of the tiny pairs)."""
    from mtpmatrix.pairs.tiny import configs

    return configs.target_template(family, PAIR)["text_config"]


def _exact(label: str, prompt: list[int], response: dict, want_new: int, topk: int | None) -> list[str]:
    """A request that must finish "length" after ``want_new`` tokens of the rule; an output that is one of the known
    Triton deviations on a server of ``topk`` is said so (``known_reads``)."""
    got = list(response.get("output_ids") or [])
    meta = response.get("meta_info") or {}
    out = []
    if finish_type(meta) != "length":
        out.append(f"{label}: finish_reason {meta.get('finish_reason')}, wanted length")
    if len(got) != want_new or meta.get("completion_tokens") != want_new:
        out.append(
            f"{label}: {len(got)} output ids, completion_tokens {meta.get('completion_tokens')}; the limit gives "
            f"{want_new} (prompt {len(prompt)} + output = {len(prompt) + want_new})"
        )
    rule = expected(prompt, want_new)
    first = next((i for i, (a, b) in enumerate(zip(got, rule)) if a != b), None)
    if first is None:
        return out
    reads = served_reads(prompt, got, pair_text())
    known = known_reads(reads, topk, meta)
    if known:
        off = sum(k not in (long_witness.READ_RULE, long_witness.READ_BOTH) for k in reads.kinds)
        return out + [f"{label}: {known} ({off} of {len(got)} tokens off the edge; token {first} is {got[first]})"]
    return out + [f"{label}: token {first} is {got[first]}, the long witness's rule gives {rule[first]}"]


def predicted_counters(completion: int, retractions: int, steps: int = settings.NUM_STEPS) -> dict:
    """What sglang's meta_info says of a request whose every draft is accepted: ``completion`` tokens (as reported)
    of which ``retractions`` came from re-prefills, ``steps`` drafts per verify step (``accept_problems`` tries
    every count a request's num_retractions allows: a request retracted again before its re-prefill's token was
    kept has fewer).

    From sglang's code (0.5.13 eagle_info verify / batch_result_processor, 0.5.17 and 0.5.23
    batch_result_processor._resolve_spec_v2_tokens): the prefill yields the first token; each (re-)prefill after a
    retraction yields one more (reset_for_retract keeps output_ids, the re-prefill of prompt + output samples the
    next), without a verify step; every verify step adds 1 to spec_verify_ct and its accepted drafts (accept_lens - 1,
    uncut) to spec_num_correct_drafts, and keeps ``steps`` + 1 tokens. No release shortens a draft tree near
    max_new_tokens or the context limit (the tokenizer reserved its slots): the step that reaches max_new_tokens runs
    whole and its extra tokens are cut from completion_tokens (Req.update_finish_state sets finished_len), and a
    step discarded for a request retracted mid-flight (overlap) counts nothing. Retractions come between steps,
    where all previous steps kept ``steps`` + 1 tokens, so spec_verify_ct = ceil((completion - 1 - retractions) /
    (steps + 1)) exactly (an abort after a retraction but before its re-prefill leaves one prefill token fewer: the
    ceiling absorbs it). Exact, not a floor: one lost draft lowers spec_num_correct_drafts by one."""
    verify = max(0, -(-meta_fields.verified_tokens(completion, retractions) // (steps + 1)))
    return {
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "accept_length": round(completion / verify, 4) if verify else None,
        "spec_num_correct_drafts": steps * verify,
        "spec_correct_drafts_histogram": [0] * steps + [verify] if verify else [],
    }


def accept_metas(exchanges) -> list[tuple[str, dict]]:
    """(label, meta_info) of every request of the family that was answered by the scheduler (the abort's
    neighbours and victim; not a victim aborted in the waiting queue, whose answer carries no counters)."""
    out = []
    for x in exchanges:
        if x.error or x.label == "over-limit":
            continue
        if x.label == "abort":
            answers = x.response.get("outputs") or []
            names = [f"abort neighbour {i}" for i in range(len(answers) - 1)] + ["abort victim"]
            metas = [(name, a.get("meta_info") or {}) for name, a in zip(names, answers)]
            out += [(name, m) for name, m in metas if not (name == "abort victim" and meta_fields.aborted_in_queue(m))]
        else:
            out.append((x.label, x.meta))
    return out


def accept_problems(spec, exchanges) -> list[str]:
    """Each request's own acceptance on an MTP server equals ``predicted_counters`` for its completion_tokens and
    the re-prefill tokens its num_retractions allow (meta_info, every release 0.5.13-0.5.23; at most one each):
    accept length, verify steps, accepted drafts and the per-step histogram (where the release reports the last
    two)."""
    from mtpmatrix.pairs.decoy import counter_mismatches

    if not spec.topk:
        return []
    served = {label: (prompt, output) for label, prompt, output in served_outputs(exchanges)}
    out = []
    for label, meta in accept_metas(exchanges):
        completion, retractions = meta.get("completion_tokens"), meta.get("num_retractions")
        if not isinstance(completion, int) or not isinstance(retractions, int):
            out.append(
                f"{label}: meta_info completion_tokens {completion}, num_retractions {retractions}: the exact "
                f"acceptance cannot be derived"
            )
            continue
        # each retraction kept at most one re-prefill token (meta_fields' tail rule): the counters must be the exact
        # pair's for some count of them, every draft accepted whichever
        wants = [predicted_counters(completion, kept) for kept in range(retractions, -1, -1)]
        if not meta.get("spec_verify_ct") and any(not w["spec_verify_ct"] for w in wants):
            continue  # done at prefill and re-prefills (an abort victim may be): no verify step, no counters
        if any(w["spec_verify_ct"] and not counter_mismatches(w, meta) for w in wants):
            continue
        want = wants[0]
        if not want["spec_verify_ct"]:
            out.append(f"{label}: spec_verify_ct {meta.get('spec_verify_ct')} for {completion} token(s) from prefill")
            continue
        bad = counter_mismatches(want, meta)
        known = _known_counters(spec.topk, meta, served.get(label)) if bad else None
        if known:
            out.append(f"{label}: {known} ({'; '.join(bad)})")
        elif bad:
            out.append(f"{label}: {'; '.join(bad)} (predicted: every draft accepted, {retractions} retraction(s))")
    return known_last(out)


def _known_counters(topk: int, meta: dict, served: tuple[list[int], list[int]] | None) -> str | None:
    """The known deviation a request's lost drafts are (TREE_SHORT: the tree verify's windows by index; EXTEND_WIDE:
    0.5.13's verify nodes one key wide), its output and counters read so (``known_reads``); None for any other."""
    if served is None:
        return None
    known = known_reads(served_reads(served[0], served[1], pair_text()), topk, meta)
    return known if known in (TREE_SHORT, EXTEND_WIDE) else None


def own_problems(spec, exchanges) -> list[str]:
    """Every way this server's answers leave what intact sglang does (module docstring); [] when none."""
    by = {x.label: x for x in exchanges}
    return (
        length_problems(spec, exchanges)
        + cache_problems(spec, by.get("prefix-repeat"))
        + accept_problems(spec, exchanges)
        + (
            abort_problems(by["abort"], limit_new(spec.topk, PROMPT), spec.topk, page_size(spec))
            if "abort" in by
            else ["abort: not sent"]
        )
    )


def length_problems(spec, exchanges) -> list[str]:
    """The limit, over-limit and prefix requests: each the rule's tokens, finished "length" after exactly the
    tokens sglang's limits give; the over-limit request refused naming the context length."""
    want = limit_new(spec.topk, PROMPT)
    out = []
    for x in exchanges:
        if x.label == "over-limit":
            if not x.error or "context length" not in x.error:
                asked = admitted_new(spec.topk, PROMPT) + 1
                out.append(f"over-limit: asked {asked} new tokens, {x.error or 'answered'}")
        elif x.label.startswith(("limit-", "prefix-")):
            if x.error:
                out.append(f"{x.label}: request failed: {x.error}")
            else:
                n = want if x.label.startswith("limit-") else PREFIX_NEW
                out += _exact(x.label, x.payload["input_ids"], x.response, n, spec.topk)
    return known_last(out)


def cache_problems(spec, repeat) -> list[str]:
    """The prefix pair's repeat hit the radix cache for the shared prefix (``cached_bounds``)."""
    if repeat is None or repeat.error:
        return [f"prefix-repeat: {'not sent' if repeat is None else repeat.error}"]
    lo, hi = cached_bounds(SHARED, page_size(spec), mtp=bool(spec.topk))
    got = repeat.meta.get("cached_tokens")
    if not isinstance(got, int) or not lo <= got <= hi:
        return [
            f"prefix-repeat: cached_tokens {got}, the {SHARED}-token shared prefix in {page_size(spec)}-token "
            f"pages gives [{lo}, {hi}] (radix hit)"
        ]
    return []


def abort_problems(x, want: int, topk: int | None, page_size: int = 1) -> list[str]:
    """The abort exchange: every neighbour exact to the limit, the victim ended by the abort with a rule prefix. The
    victim must have decoded beside its neighbours when the abort went out, except on a paged server, whose pool
    may keep it queued (measured on 0.5.17's paged topk 3 server: "a request finished first: [81, 0]"); everywhere
    else every abort of the H200 runs was sent at [1, 1] (docs/runs/2026-12-05*). A victim that did not end "abort"
    tested nothing where ``_abort_untested`` says why (the clocks show it done before the abort was sent: the client
    read its stream late, H200 2026-12-05e; or the abort went out before it had a token); else it ignored the abort.
    Either way its tokens and its neighbours' are held to the rule."""
    if not x.response.get("aborted_mid_batch"):
        return [f"abort: the abort was not sent mid-batch ({x.response.get('abort_note')}): nothing was tested"]
    item = x.payload
    outputs = x.response.get("outputs") or []
    if len(outputs) != len(item.neighbours) + 1:
        return [f"abort: {len(outputs)} answers for {len(item.neighbours) + 1} requests"]
    victim = outputs[-1]
    meta = victim.get("meta_info") or {}
    got = list(victim.get("output_ids") or [])
    out = []
    for i, (body, resp) in enumerate(zip(item.neighbours, outputs)):
        out += _exact(f"abort neighbour {i}", body["input_ids"], resp, want, topk)
    untested = _abort_untested(x.response, meta)
    if untested:  # no abort reached the victim: its output and its neighbours' are still held to the rule
        out += _follows_rule("abort victim", item.victim["input_ids"], got, topk, meta)
        return known_last(out) if out else [f"abort: {untested}: nothing was tested"]
    if page_size == 1 and not got and not meta.get("completion_tokens"):
        return [
            f"abort: the victim had decoded nothing when it was aborted ({x.response.get('abort_note')}): the abort "
            f"of a running request was not tested (on an unpaged server it decodes beside its neighbours)"
        ]
    if finish_type(meta) != "abort":
        out.append(f"abort victim: finish_reason {meta.get('finish_reason')}, wanted abort")
    if not len(got) < want:
        out.append(f"abort victim: {len(got)} tokens, the whole {want}: the abort did not stop it")
    out += _follows_rule("abort victim", item.victim["input_ids"], got, topk, meta)
    return known_last(out)


def _follows_rule(label: str, prompt: list[int], got: list[int], topk: int | None, meta: dict) -> list[str]:
    if got == expected(prompt, len(got)):
        return []
    known = known_reads(served_reads(prompt, got, pair_text()), topk, meta)
    return [f"{label}: {known}" if known else f"{label}: its {len(got)} tokens leave the rule"]


def _abort_untested(response: dict, meta: dict) -> str:
    """Why a victim that did not end "abort" says nothing of sglang's abort ("" when it ignored one): the clocks show
    it finished before the abort was sent, or the abort went out while it had streamed nothing (the queued branch)
    and sglang may not have known its request yet (an unknown rid is answered 200 and nothing is done)."""
    if finish_type(meta) == "abort":
        return ""
    late = finished_before_abort(response)
    if late:
        return f"the victim ran to its end before the abort was sent ({late}; {response.get('abort_note')})"
    if response.get("victim_tokens_at_abort") == 0:
        return (
            f"the abort went out before the victim had streamed a token ({response.get('abort_note')}) and it ran on: "
            "sglang may not have known its request yet"
        )
    return ""


def served_outputs(exchanges) -> list[tuple[str, list[int], list[int]]]:
    """(label, prompt, output ids) of every request of the family that was answered with tokens: the limit and
    prefix requests, the abort's neighbours and victim."""
    out = []
    for x in exchanges:
        if x.error or x.label == "over-limit":
            continue
        if x.label == "abort":
            bodies = [*x.payload.neighbours, x.payload.victim]
            names = [f"abort neighbour {i}" for i in range(len(bodies) - 1)] + ["abort victim"]
            answers = x.response.get("outputs") or []
            out += [(n, b["input_ids"], list(a.get("output_ids") or [])) for n, b, a in zip(names, bodies, answers)]
        else:
            out.append((x.label, x.payload["input_ids"], list(x.output_ids)))
    return out


# What of an answer's meta_info the reads record keeps beside an output off the rule: what a deviation's signature is
# told by (long_deviations: the retractions, the prefill's cached prefix, the verify counters)
RECORDED_META = (
    "finish_reason",
    "completion_tokens",
    "num_retractions",
    "cached_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_correct_drafts_histogram",
)


def reads(exchanges, text: dict) -> dict[str, dict]:
    """Per answered request, what each output token is (long_witness.read_kinds: the window's-edge read, the read of a
    window one key short, both, a window one key wide, none), and, where some token is not the edge's read, its ids
    and its answer's counters (RECORDED_META): the record a deviation is read from again, by every read a token fits
    (0.5.13's signature was found so, 2026-12-05)."""
    metas = dict(accept_metas(exchanges))
    out = {}
    for label, prompt, output in served_outputs(exchanges):
        kinds = long_witness.read_kinds(prompt, output, text)
        out[label] = {"reads": kinds}
        if set(kinds) - {long_witness.READ_RULE, long_witness.READ_BOTH}:
            meta = metas.get(label) or {}
            out[label].update(output_ids=output, meta={k: meta[k] for k in RECORDED_META if k in meta})
    return out


def _follows(prompt: list[int], output: list[int], topk: int | None, meta: dict) -> str | None:
    """ "follows the rule", the known deviation (``known_reads``) ``output`` is on a server of ``topk``, or None."""
    if list(output) == expected(prompt, len(output)):
        return "follows the rule"
    return known_reads(served_reads(prompt, output, pair_text()), topk, meta)


def against_reference(exchanges, reference, topk: int | None = None) -> list[str]:
    """MTP output equals the no-MTP twin's: token for token where both ran (an MTP server stops earlier, by its
    reserved slots): exactly for the prefix pair, on the common prefix for the abort's neighbours (their lengths,
    which the servers' limits make differ, are held by ``abort_problems``). Where they differ because the twin's
    output is the Triton decode one key short (``decode_reads_short``) and the MTP output (on a server of ``topk``)
    the rule's or its own known deviation (``known_reads``), the problem says which, after every other."""
    out = reference_gaps(exchanges, reference)
    for x, r in both_answered(exchanges, reference):
        if x.label == "over-limit":
            continue
        if x.label == "abort":
            prompts = [b["input_ids"] for b in x.payload.neighbours]
            mine = (x.response.get("outputs") or [])[:-1]
            twin = (r.response.get("outputs") or [])[:-1]
        else:
            prompts, mine, twin = [x.payload["input_ids"]], [x.response], [r.response]
        for k, (prompt, m, t) in enumerate(zip(prompts, mine, twin)):
            a, b = list(m.get("output_ids") or []), list(t.get("output_ids") or [])
            n = min(len(a), len(b))
            if a[:n] == b[:n] and not (x.label.startswith("prefix-") and a != b):
                continue
            label = f"{x.label}{f' neighbour {k}' if x.label == 'abort' else ''}"
            twin_says = _follows(prompt, b, None, t.get("meta_info") or {})
            mine_says = _follows(prompt, a, topk, m.get("meta_info") or {})
            if twin_says and mine_says:
                out.append(f"{label}: the no-MTP twin {twin_says}; the MTP output {mine_says}")
            else:
                out.append(f"{label}: output differs from no-MTP's")
    return known_last(out)
