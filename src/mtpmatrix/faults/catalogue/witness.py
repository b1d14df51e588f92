"""Mutants the witness servers see: the drafter seeded with the wrong hidden state, the wrong frozen-KV layer,
shifted RoPE positions, the wrong tree parent, rows of different requests mixed, lossy verification, a wrong
accept-length counter, the draft CUDA graph never captured."""

from __future__ import annotations

from mtpmatrix.faults.catalogue.servers import TOPK1, TOPK3
from mtpmatrix.faults.catalogue.sglang_modules import (
    BATCH_RESULT_PROCESSOR,
    EAGLE_INFO,
    EAGLE_INFO_V2,
    EAGLE_UTILS,
    FROZEN_KV_MTP_UTILS,
    FROZEN_KV_MTP_WORKER,
    FROZEN_KV_MTP_WORKER_V2,
    GEMMA4_MTP,
    METRICS_REPORTER,
    SPEC_UTILS,
)
from mtpmatrix.faults.mutation import Mutant, Site

_SELECT_LAST = "* self.speculative_num_draft_tokens\n            + batch_result.accept_lens\n            - 1\n"
_EXPAND = (
    "    forward_batch.req_pool_indices = forward_batch.req_pool_indices.repeat_interleave(\n"
    "        topk, dim=0\n"
    "    )\n"
    "    forward_batch.seq_lens = forward_batch.seq_lens.repeat_interleave(topk, dim=0)\n"
    "    if forward_batch.seq_lens_cpu is not None:\n"
    "        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu.repeat_interleave(\n"
    "            topk, dim=0\n"
    "        )\n"
)
_LOOP_POSITIONS = (
    "            forward_batch.spec_info.hidden_states = hidden_states\n"
    "            self._set_positions(forward_batch)\n"
)
_SHIFT_TARGET = "; target_predict = torch.cat([target_predict[:, 1:], target_predict[:, -1:]], dim=1)\n"
_SWAP_TYPE = '{"sliding_attention": "full_attention", "full_attention": "sliding_attention"}.get(t, t)'

WITNESS_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "handoff-block-first",
        "handoff",
        "drafter seeded with the target hidden state of the verify block's first position, not the last accepted",
        (
            Site(
                FROZEN_KV_MTP_WORKER_V2,
                _SELECT_LAST,
                "* self.speculative_num_draft_tokens\n            + 0 * batch_result.accept_lens\n            + 0\n",
            ),
            Site(
                FROZEN_KV_MTP_UTILS,
                "        draft_input.hidden_states[last_indices],\n",
                "        draft_input.hidden_states[last_indices - counts + 1],\n",
            ),
        ),
        expect="test_spec_metrics (acceptance collapses, output stays right)",
    ),
    Mutant(
        "handoff-stale-by-one",
        "handoff",
        "drafter seeded with the hidden state one accepted position before the last (stale by one step)",
        (
            Site(
                FROZEN_KV_MTP_WORKER_V2,
                _SELECT_LAST,
                "* self.speculative_num_draft_tokens\n"
                "            + batch_result.accept_lens\n"
                "            - 1 - (batch_result.accept_lens > 1).to(batch_result.accept_lens.dtype)"
                "\n",
            ),
            Site(
                FROZEN_KV_MTP_UTILS,
                "        draft_input.hidden_states[last_indices],\n",
                "        draft_input.hidden_states[last_indices - (counts > 1).long()],\n",
            ),
        ),
        servers=TOPK1,
        expect="test_spec_metrics",
    ),
    Mutant(
        "kv-layer-first-of-type",
        "kv-binding",
        "each assistant layer reads the KV of the first target layer of its type instead of the last",
        (Site(GEMMA4_MTP, "for i in (L - 2, L - 1)}", "for i in reversed(range(L))}"),),
        servers=TOPK1,
        expect="test_spec_metrics (only where the first and last KV owner of a type differ: sliding in the tiny pairs)",
    ),
    Mutant(
        "kv-layer-type-swap",
        "kv-binding",
        "sliding assistant layers read the full-attention KV and vice versa",
        (
            Site(
                GEMMA4_MTP,
                "            physical[i] = by_type[t]\n",
                f"            physical[i] = by_type[{_SWAP_TYPE}]\n",
            ),
        ),
        servers=TOPK1,
        expect="test_server_serves (head dims differ: likely a launch crash), else test_spec_metrics",
    ),
    Mutant(
        "draft-position-ahead",
        "positions",
        "RoPE position of every draft step one ahead of the last written target slot",
        (
            Site(
                FROZEN_KV_MTP_UTILS,
                "positions = torch.clamp(seq_lens - 1, min=0).to(torch.int64)",
                "positions = torch.clamp(seq_lens, min=0).to(torch.int64)",
            ),
        ),
        servers=TOPK1,
        expect="test_spec_metrics",
    ),
    Mutant(
        "draft-position-advanced",
        "positions",
        "RoPE position advanced per draft step (Frozen-KV MTP keeps the last target slot for every step)",
        (
            Site(
                FROZEN_KV_MTP_WORKER_V2,
                _LOOP_POSITIONS,
                _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n",
            ),
            Site(
                FROZEN_KV_MTP_WORKER, _LOOP_POSITIONS, _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n"
            ),
        ),
        servers=TOPK1,
        expect="test_spec_metrics (steps after the first draft go wrong)",
    ),
    Mutant(
        "topk-parent-hidden",
        "tree-parent",
        "at topk > 1 each new draft node continues from the hidden state of the next sibling, not its parent",
        (
            Site(
                SPEC_UTILS,
                "selected_input_index = flat_cs // topk + batch_offsets",
                "selected_input_index = (flat_cs // topk + 1) % topk + batch_offsets",
            ),
        ),
        servers=TOPK3,
        expect="test_spec_metrics[witness-mtp-topk3]",
    ),
    Mutant(
        "topk-expand-seed-rows",
        "batch-expansion",
        "at topk > 1 the seed hidden states are tiled (repeat) instead of repeated per request (repeat_interleave)",
        (
            Site(
                FROZEN_KV_MTP_WORKER_V2,
                "seed_prev_hidden = target_hidden.repeat_interleave(self.topk, dim=0)",
                "seed_prev_hidden = target_hidden.repeat(self.topk, 1)",
            ),
            Site(
                FROZEN_KV_MTP_WORKER,
                "seed_prev_hidden = target_hidden.repeat_interleave(self.topk, dim=0)",
                "seed_prev_hidden = target_hidden.repeat(self.topk, 1)",
            ),
        ),
        servers=TOPK3,
        expect="test_spec_metrics[witness-mtp-topk3] (needs > 1 request per batch)",
    ),
    Mutant(
        "topk-expand-kv-rows",
        "batch-expansion",
        "at topk > 1 the draft rows read the KV and positions of other requests (repeat vs repeat_interleave)",
        (
            Site(
                FROZEN_KV_MTP_UTILS,
                _EXPAND,
                _EXPAND.replace(".repeat_interleave(\n", ".repeat(\n")
                .replace("topk, dim=0\n", "topk\n")
                .replace(".repeat_interleave(topk, dim=0)", ".repeat(topk)"),
            ),
        ),
        servers=TOPK3,
        expect="test_spec_metrics[witness-mtp-topk3] (needs > 1 request per batch)",
    ),
    Mutant(
        "verify-target-row-shift",
        "lossy-verify",
        "verification reads the target's prediction one tree row late, so it commits tokens the target would not "
        "have produced",
        (
            Site(
                EAGLE_UTILS,
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _SHIFT_TARGET,
            ),
            Site(
                EAGLE_INFO,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _SHIFT_TARGET,
            ),
            Site(
                EAGLE_INFO_V2,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _SHIFT_TARGET,
            ),
        ),
        expect="the witness rule check (mismatch), and test_spec_metrics",
    ),
    Mutant(
        "accept-count-request",
        "accounting",
        "each verify step counted twice in the per-request spec_verify_ct (accept length per request halves)",
        (
            Site(EAGLE_INFO, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n"),
            Site(BATCH_RESULT_PROCESSOR, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n"),
        ),
        servers=TOPK1,
        expect="test_spec_metrics (per-request accept length under the floor, and off the "
        "server's avg_spec_accept_length); test_meta_info_fields_agree (histogram counts half "
        "the verify steps)",
    ),
    Mutant(
        "accept-count-server",
        "accounting",
        "the scheduler's forward count behind avg_spec_accept_length counted twice (server-side average halves)",
        (Site(METRICS_REPORTER, "self.spec_num_forward_ct += bs\n", "self.spec_num_forward_ct += 2 * bs\n"),),
        servers=TOPK1,
        expect="test_spec_metrics and test_meta_info_fields_agree (avg_spec_accept_length "
        "inconsistent with per-request numbers)",
    ),
    Mutant(
        "draft-cuda-graph-skipped",
        "cuda-graph",
        "the Frozen-KV draft CUDA graph is never captured (the draft loop silently runs eagerly)",
        (
            Site(FROZEN_KV_MTP_WORKER_V2, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
            Site(FROZEN_KV_MTP_WORKER, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
        ),
        servers=TOPK1,
        expect="test_cuda_graphs_captured (no draft capture line)",
    ),
)
