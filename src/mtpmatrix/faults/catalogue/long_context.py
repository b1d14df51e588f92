"""Mutants only the long-and-tight family sees (tests/tiers/test_smoke_long.py on the long witness, issue #38 item 2):
a verify node that loses the far edge of its sliding window, a finished request's speculatively over-allocated KV
never freed, the draft slots not reserved against the context limit. Each runs on the family's three servers: the
no-MTP twin passes beside the two MTP servers, where the edit is live."""

from __future__ import annotations

from mtpmatrix.faults.catalogue.servers import LONG
from mtpmatrix.faults.catalogue.sglang_modules import MEM_CACHE_COMMON, TOKENIZER_MANAGER, TRITON_BACKEND
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
        expect="test_long_requests_run_to_the_limit and test_long_match_no_mtp on long-witness-mtp-topk1 / "
        "-topk3-paged (and the abort neighbours): past position 63 the long witness's next token is the successor "
        "of the member at the window's far edge (63 back), which the root node no longer sees, so the first token "
        "of every verify step leaves the rule; the custom mask stays aligned (offset and row both move by one), so "
        "nothing crashes. long-witness-nomtp passes: decode builds its window elsewhere. Models sglang PR #9279 "
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
        expect="test_long_pool_empty_when_idle[long-witness-mtp-topk1/topk3-paged]: sglang's own idle check "
        "(scheduler on_idle -> _check_all_pools) logs 'memory leak detected!' once the server is idle with the "
        "stranded slots neither free nor in the radix tree; the outputs stay exact (a smaller pool only retracts "
        "more). long-witness-nomtp passes (no over-allocation: start_p == end_p). Models the stranded-tail KV leak "
        "of sglang PR #31616 (page-aligned EAGLE allocation) and #13826 (kv_allocated_len not recorded, nothing "
        "released). No old check reads the idle leak report",
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
)
