"""Mutants only the long-and-tight family sees (tests/tiers/test_smoke_long.py on the long witness, issue #38 item 2):
a verify node that loses the far edge of its sliding window, a finished request's speculatively over-allocated KV
never freed, the draft slots not reserved against the context limit, a drafter whose frozen-KV view of a request
leaves out its radix-cached prefix. Each runs on the family's three servers: the no-MTP twin passes beside the two
MTP servers, where the edit is live."""

from __future__ import annotations

from mtpmatrix.faults.catalogue.servers import LONG
from mtpmatrix.faults.catalogue.sglang_modules import (
    FROZEN_KV_MTP_WORKER,
    FROZEN_KV_MTP_WORKER_V2,
    MEM_CACHE_COMMON,
    TOKENIZER_MANAGER,
    TRITON_BACKEND,
)
from mtpmatrix.faults.mutation import Mutant, Site

# TritonAttnBackend's target-verify window buffers (update_sliding_window_buffer: window_kv_lens = min(seq_lens,
# size), the window's first slot seq_lens - window_kv_lens, which is also the offset of the custom mask's window):
# the CUDA-graph path (_update_target_verify_buffers, every verify batch <= --cuda-graph-max-bs) and the eager one
# (init_forward_metadata's target-verify branch; 0.5.23 passes the KV plan first, so bs follows seq_lens there).
_SWA_GRAPH = "                    self.sliding_window_size,\n                    seq_lens[:bs],\n"
_SWA_EAGER = (
    "                    self.sliding_window_size,\n"
    "                    forward_batch.seq_lens,\n"
    "                    forward_batch.req_pool_indices,\n"
)
_SWA_EAGER_23 = "                    self.sliding_window_size,\n                    forward_batch.seq_lens,\n                    bs,\n"


# The Frozen-KV draft's forward batch, built from the decode batch just before its positions are set from seq_lens
# (set_frozen_kv_positions: the last written target slot) and before the topk expansion repeats it: the same two
# lines in the v1 worker's draft() (0.5.13) and the spec-v2 one's (0.5.17, 0.5.23). The edit takes each request's
# radix-cached prefix (Req.cached_tokens, what meta_info reports) off the view's seq_lens, CPU copy and sum alike, so
# the drafter's KV view and RoPE position count only the tokens the request computed itself; batch.seq_lens, which
# verify and its tree positions use, is left alone.
_DRAFT_VIEW = "        assert forward_batch.capture_hidden_mode == CaptureHiddenMode.LAST\n        self._set_positions(forward_batch)\n"
_DRAFT_VIEW_CACHED_DROPPED = _DRAFT_VIEW.replace(
    "        self._set_positions(forward_batch)\n",
    "        _cached = torch.tensor([r.cached_tokens for r in batch.reqs], dtype=torch.int64)\n"
    "        forward_batch.seq_lens = forward_batch.seq_lens - _cached.to(\n"
    "            device=forward_batch.seq_lens.device, dtype=forward_batch.seq_lens.dtype\n"
    "        )\n"
    "        if forward_batch.seq_lens_cpu is not None:\n"
    "            forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu - _cached.to(forward_batch.seq_lens_cpu.dtype)\n"
    "        forward_batch.seq_lens_sum = int(forward_batch.seq_lens.sum().item())\n"
    "        self._set_positions(forward_batch)\n",
)


def _one_short(anchor: str) -> str:
    return anchor.replace("self.sliding_window_size,", "self.sliding_window_size - 1,", 1)


LONG_CONTEXT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "swa-verify-window-short",
        "swa-verify",
        "target verify gathers each request's sliding-window KV one slot short (the window's oldest slot, "
        "seq_len - 63, left out), while the kernel's window mask still allows it: the first verify node (the "
        "root, whose token is the bonus when draft 1 is rejected) cannot read the far edge of its window",
        (
            Site(TRITON_BACKEND, _SWA_GRAPH, _one_short(_SWA_GRAPH)),  # 0.5.13-0.5.23
            Site(TRITON_BACKEND, _SWA_EAGER, _one_short(_SWA_EAGER)),  # 0.5.13, 0.5.17
            Site(TRITON_BACKEND, _SWA_EAGER_23, _one_short(_SWA_EAGER_23)),  # 0.5.23
        ),
        servers=LONG,
        expect="test_long_requests_run_to_the_limit on long-witness-mtp-topk1 / -topk3-paged (and the abort "
        "neighbours): past position 63 the long witness's next token is the successor of the member at the "
        "window's far edge (63 back), which the root node no longer sees, so the first token of every verify step "
        "leaves the rule; the custom mask stays aligned (offset and row both move by one), so nothing crashes. "
        "test_long_match_no_mtp cannot see it: intact sglang's no-MTP decode reads the same window one key short "
        "(known upstream sglang-triton-swa-decode-window-one-short), so the two agree. long-witness-nomtp's own "
        "checks are unchanged: decode builds its window elsewhere. Models sglang PR #9279 "
        "(EAGLE verify on sliding-window layers read outside the window on the Triton backend). No old check "
        "sees it: no other pair's target output depends on attention past the window",
    ),
    Mutant(
        "spec-overalloc-tail-kept",
        "kv-release",
        "release_kv_cache frees a finished request's over-allocated KV (the slots speculative decode reserved past "
        "the committed length: 2 x the per-step allocation, page-aligned) only when no speculative algorithm runs, "
        "so under MTP every finished request strands its tail in the pool",
        (Site(MEM_CACHE_COMMON, "    if start_p < end_p:\n", "    if start_p < end_p and spec_algo is None:\n"),),
        servers=LONG,
        na_on=("0.5.13",),
        na_why="its Frozen-KV MTP is the v1 worker, whose verify sets kv_allocated_len = kv_committed_len each step "
        "(eagle_info.py EagleVerifyInput.verify): a finished request has no over-allocated tail, so the edit "
        "changes nothing",
        expect="every check of long-witness-mtp-topk1 and -topk3-paged, as launch: the readiness probe's request "
        "(/health_generate) strands its tail, and at the first idle moment sglang's own idle check (scheduler on_idle "
        "-> invariant_checker._report_leak, strict by default: SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE) raises "
        "'pool memory leak detected!', the scheduler dies and the server exits before it is ready (H200 2026-12-05e: "
        "[full] total=640, available=628 at topk 1, 448 on the 16-page topk 3 server); where the check only warns, "
        "test_long_pool_empty_when_idle reads the same line in the log. long-witness-nomtp passes (no "
        "over-allocation: start_p == end_p). Models the stranded-tail KV leak of sglang PR #31616 (page-aligned EAGLE "
        "allocation) and #13826 (kv_allocated_len not recorded, nothing released). No old check reads the idle leak "
        "report",
    ),
    Mutant(
        "spec-context-reserve-dropped",
        "context-limit",
        "the tokenizer's context-length check no longer counts the slots speculative decoding reserves per request "
        "for drafts (num_reserved_tokens: max(topk x steps, draft tokens)), so an MTP request may ask for the whole "
        "context and its drafts run past it",
        (
            Site(
                TOKENIZER_MANAGER,
                "        input_token_num += self.num_reserved_tokens\n",
                "        input_token_num += 0 * self.num_reserved_tokens\n",
            ),
        ),
        servers=LONG,
        expect="test_long_requests_run_to_the_limit[long-witness-mtp-topk1/topk3-paged] (over-limit: a request for "
        "one token more than long_context.admitted_new, 91 / 82 new tokens, is answered instead of refused with "
        "the context length; 160 + 91 tokens + 6 drafts stay inside the req_to_token row, 256 + 4 + draft tokens "
        "wide, so the server stays up). long-witness-nomtp passes (it reserves 0). Models the req_to_token "
        "headroom class near the context limit (the reservation exists because EAGLE stores drafts in the output "
        "slots). No old request comes near its context limit",
    ),
    Mutant(
        "frozen-kv-view-drops-cached",
        "draft-view",
        "the Frozen-KV drafter's view of a request with a radix-cache hit (its seq_lens, hence the KV it reads and "
        "its RoPE position) counts only the tokens the request computed itself, as if its cached prefix were not "
        "there: every draft of that request reads the wrong positions of the target's frozen KV; the target, its "
        "verify and the output are untouched",
        (
            Site(FROZEN_KV_MTP_WORKER, _DRAFT_VIEW, _DRAFT_VIEW_CACHED_DROPPED),  # 0.5.13 (v1 worker)
            Site(FROZEN_KV_MTP_WORKER_V2, _DRAFT_VIEW, _DRAFT_VIEW_CACHED_DROPPED),  # 0.5.17, 0.5.23
        ),
        servers=LONG,
        expect="test_long_accept_exact[long-witness-mtp-topk1/topk3-paged]: prefix-repeat (cached_tokens 99 / 96) "
        "drafts from a view that ends 99 / 96 positions early, so its sliding read lands on the wrong member and "
        "every draft is rejected (about 31 verify steps for its 31 tokens after the prefill, accept length ~1.03, "
        "predicted 6 and 5.3333); at topk 1 the 1-token hits (BOS, key) of prefix-first and the abort group move "
        "the view one position (the pair's position ablation). Every output, length, cached_tokens, the abort and "
        "the no-MTP match stay exact (a drafter never changes a greedy output), so no other check sees it; "
        "long-witness-nomtp has no drafter. Models the speculative-decoding-with-prefix-caching class issue #38 "
        "lists (vLLM #40624 names Gemma 4 with speculative decoding and prefix caching): a draft path that derives "
        "its sequence length from the extend (the uncached tokens) instead of the full sequence",
    ),
)
