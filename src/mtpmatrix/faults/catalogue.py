"""The fault-injection catalogue: small source mutations of the installed sglang's MTP path, and applying them.

Each mutant is one deliberate bug of the kind the smoke tier exists to catch (the drafter seeded with the wrong
hidden state, the wrong frozen-KV layer, shifted RoPE positions, the wrong tree parent, rows of different requests
mixed, lossy verification, a wrong accept-length counter, the draft CUDA graph never captured; and, seen only by the
decoy and sampled servers, a tree parent off the first branch, a verify that takes every draft, a sampled verify
without the request's temperature, top-k/top-p or accept threshold, a miscounted per-request metric field; and, seen
only by the request families of mtpmatrix.tiers.surface or by one server's scheduler / graph mode, a stop inside an
accepted run, logprobs of the wrong node, one request's temperature for the whole batch, a greedy bonus token
at T > 0, a non-overlap scheduler that drops the advanced seq_lens, an eager draft that misses the last KV slot, a
verify without logit_bias, a greedy request sampled in a mixed verify batch, seeded requests' verify coins unseeded).
A mutant is a list of sites, each *module + anchor text + replacement*; every site whose anchor occurs exactly once in
the installed release is applied (several sites carry one bug across releases, e.g. the non-overlap worker of 0.5.13
and the spec-v2 worker of 0.5.17). No site applies: the mutant is "n.a." for this release and never counts as killed.

The installed files are never edited: the patched text goes into ``<out>/<id>/mutant.json`` (``hook_payload``) and
the hook in ``mutant_hook/sitecustomize.py`` (first on PYTHONPATH for the pytest run and every server process it
launches) serves it in place of the module. Every process that loads a patched module says so in its log (``MARK``).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core.schema import comma_list
from mtpmatrix.core.smoke_servers import DECOY_SERVERS, SAMPLED_SERVERS, WITNESS_SERVERS  # defined once, in smoke

HOOK_DIR = Path(__file__).resolve().parent / "mutant_hook"
ENV_MUTANT = "MTPMATRIX_MUTANT"  # read by mutant_hook/sitecustomize.py
MARK = "mtpmatrix-mutant:"  # the hook's log lines

# The smoke servers a mutant's suite launches unless its catalogue entry says otherwise: the witness pair, whose
# drafter needs the right hidden state, KV layer, positions, tree parent and its own request's rows to draft right.
DEFAULT_SERVERS = WITNESS_SERVERS
TOPK1, TOPK3 = (WITNESS_SERVERS[0],), (WITNESS_SERVERS[1],)
# Smoke servers that see what the witness cannot: the decoy witness (greedy; the drafter ranks a wrong decoy first at
# known inputs, so verify must reject it and, at topk 3, the accepted path runs through non-first branches) and the
# sampled pair (temperature, top-k, top-p; a closed-form target distribution). Defined once, in smoke.
DECOY_TOPK1, DECOY_TOPK3 = (DECOY_SERVERS[0],), (DECOY_SERVERS[1],)
SAMPLED_MTP = SAMPLED_SERVERS

CATEGORIES = {
    "handoff": "hidden-state handoff to the drafter",
    "kv-binding": "frozen-KV layer binding",
    "positions": "RoPE positions of draft steps",
    "tree-parent": "topk tree parents",
    "batch-expansion": "batch expansion at topk > 1",
    "lossy-verify": "lossy verification",
    "accounting": "accept-length accounting",
    "cuda-graph": "draft CUDA-graph capture",
    "sampled-verify": "sampled verification (temperature, top-k/top-p, accept thresholds)",
    "metric-fields": "per-request speculative metric fields",
    # the request surface (mtpmatrix.tiers.surface): what only requests other than greedy ignore_eos ones reach
    "stops": "EOS / stop tokens inside a verify step's accepted run",
    "logprobs": "output logprobs of speculatively accepted tokens",
    "mixed-sampling": "per-request sampling parameters in a mixed verify batch",
    "sampled-bonus": "the bonus token of a fully accepted sampled verify step",
    "sched-modes": "code only the non-overlap scheduler or the eager draft path runs",
    "sampling-feats": "sampling features (logit_bias, penalties) applied in verify",
    "seeded": "the verify coins of seeded (sampling_seed) requests",
}


class MutantsError(Exception):
    """Bad input or an unusable environment: one line, exit status 2."""


@dataclass(frozen=True)
class Site:
    """Replace ``anchor`` (which must occur exactly once) by ``replacement`` in ``module``."""

    module: str
    anchor: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    id: str
    category: str  # a CATEGORIES key
    models: str  # the bug it models, one line
    sites: tuple[Site, ...]
    servers: tuple[str, ...] = DEFAULT_SERVERS
    expect: str = ""  # the smoke check(s) expected to kill it, and why
    # releases (x.y.z) whose Frozen-KV MTP path lacks the modelled code: the mutant is n.a. there by design, said
    # by ``na_why`` (no anchor, or an anchor on a path Frozen-KV MTP does not take there, or takes so that the edit
    # changes nothing: an equivalent mutant would "survive" and prove nothing)
    na_on: tuple[str, ...] = ()
    na_why: str = ""


# Modules of the MTP path, by release: 0.5.13 runs Frozen-KV MTP on the non-overlap worker (frozen_kv_mtp_worker,
# EAGLE v1 verify in eagle_info); 0.5.17 and later on the spec-v2 worker (frozen_kv_mtp_worker_v2, eagle_utils).
_W1 = "sglang.srt.speculative.frozen_kv_mtp_worker"
_W2 = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
_FKU = "sglang.srt.speculative.frozen_kv_mtp_utils"
_SPU = "sglang.srt.speculative.spec_utils"
_EAU = "sglang.srt.speculative.eagle_utils"
_EAI = "sglang.srt.speculative.eagle_info"
_EAI2 = "sglang.srt.speculative.eagle_info_v2"
_G4 = "sglang.srt.models.gemma4_mtp"
_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor"
_MRP = "sglang.srt.managers.scheduler_components.metrics_reporter"
_SB = "sglang.srt.managers.schedule_batch"
_SCHED = "sglang.srt.managers.scheduler"
_LP13 = "sglang.srt.layers.utils.logprob"  # 0.5.13: add_output_logprobs_for_spec_v1 (the v1 worker's logprobs)
_LP17 = "sglang.srt.layers.logprob_processor"  # 0.5.17 compute_spec_v2_logprobs, 0.5.23 compute_spec_logprobs

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
# Greedy verify that takes every draft: the target's prediction at each chain position replaced by the next draft
# (topk 1 layout: position 0 the last verified token, 1..steps the drafts), the bonus from the target's last row.
_ACCEPT_ALL = (
    "; target_predict = torch.cat([candidates[:, 1:].to(target_predict.dtype), target_predict[:, -1:]], dim=1)\n"
)

# Smoke servers the request-surface mutants need (smoke_servers.SMOKE_SERVERS; tests/unit/test_catalogue_surface.py checks
# the names): the no-MTP references that the MTP-equals-no-MTP checks compare with, and the servers of a mode no
# other server runs (non-overlap scheduler, eager draft path), each beside its default-mode twin so that one suite
# shows the mode's checks failing while the same checks on the default server pass.
WITNESS_NOMTP, SAMPLED_NOMTP = "witness-nomtp", "sampled-nomtp"
WITNESS_SURFACE = WITNESS_SERVERS + (WITNESS_NOMTP,)
DECOY_NO_OVERLAP = ("decoy-mtp-topk3-no-overlap", DECOY_SERVERS[1])
WITNESS_EAGER = ("witness-mtp-topk3-eager", WITNESS_SERVERS[1])

# The bonus token of a fully accepted sampled verify step taken greedily: after the tree sampling kernel, for every
# request whose drafts were all accepted (num_correct_drafts == accept_index width - 1), overwrite the last output
# token (predict at the last accepted node, accept_index[i, num_correct_drafts]) with the argmax of that node's
# target distribution (tree_speculative_sampling_target_only samples it from relu(target - 0) = target).
_GREEDY_BONUS = (
    "_full = num_correct_drafts == accept_index.shape[1] - 1; "
    "_last = accept_index[torch.arange(bs, device=predict.device), num_correct_drafts.long()]"
    ".long()[_full]; "
    "predict[_last] = target_probs.reshape(-1, target_probs.shape[-1])[_last].argmax(dim=-1)"
    ".to(predict.dtype)\n"
)
_TOP2_13 = "sampling_info.top_ks.clamp(min=2), self.draft_token_num, dim=0\n"
_SAMPLE_END_17 = "            deterministic=True,\n        )\n\n        # Sync sampling results across TP ranks"
_SAMPLE_END_13 = (
    "                deterministic=True,\n            )\n\n            # Sync sampling results across TP ranks"
)
_SAMPLE_END_23 = "        del (\n            expanded_temperature,\n"
# 0.5.17's non-overlap scheduler branch for the spec-v2 worker (Scheduler.run_batch): after _forward_isolation
# restores the batch, it re-applies the draft input and the advanced seq_lens. 0.5.13 has the same lines under
# ``elif batch.is_spec_v2`` (a path its Frozen-KV MTP, a v1 worker, never takes): the comment line keeps it out.
_NO_OVERLAP_17 = (
    "                # Non-overlap: drive the V2 worker synchronously (no\n"
    "                # future_map relay / on_publish).\n"
    "                resolve_forward_inputs(batch, self.future_map)\n"
    "                with self._forward_isolation(batch, overlap=False):\n"
    "                    batch_result = self.model_worker.forward_batch_generation(batch)\n"
    "                # The isolation restore reverted the worker's in-forward SB edits;\n"
    "                # re-apply what must carry to the next iter.\n"
    "                batch.spec_info = batch_result.next_draft_input\n"
    "                if batch_result.new_seq_lens is not None:\n"
)
_EAGER_META = (
    "        with self._frozen_kv_target_view(forward_batch):\n"
    "            self.draft_attn_backend.init_forward_metadata(forward_batch)\n"
)
_EAGER_SHORT = (
    "        with self._frozen_kv_target_view(forward_batch):\n"
    "            _lens, forward_batch.seq_lens = forward_batch.seq_lens, forward_batch.seq_lens - 1\n"
    "            self.draft_attn_backend.init_forward_metadata(forward_batch)\n"
    "            forward_batch.seq_lens = _lens\n"
)

CATALOGUE: tuple[Mutant, ...] = (
    Mutant(
        "handoff-block-first",
        "handoff",
        "drafter seeded with the target hidden state of the verify block's first position, not the last accepted",
        (
            Site(
                _W2,
                _SELECT_LAST,
                "* self.speculative_num_draft_tokens\n            + 0 * batch_result.accept_lens\n            + 0\n",
            ),
            Site(
                _FKU,
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
                _W2,
                _SELECT_LAST,
                "* self.speculative_num_draft_tokens\n"
                "            + batch_result.accept_lens\n"
                "            - 1 - (batch_result.accept_lens > 1).to(batch_result.accept_lens.dtype)"
                "\n",
            ),
            Site(
                _FKU,
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
        (Site(_G4, "for i in (L - 2, L - 1)}", "for i in reversed(range(L))}"),),
        servers=TOPK1,
        expect="test_spec_metrics (only where the first and last KV owner of a type differ: sliding in the tiny pairs)",
    ),
    Mutant(
        "kv-layer-type-swap",
        "kv-binding",
        "sliding assistant layers read the full-attention KV and vice versa",
        (Site(_G4, "            physical[i] = by_type[t]\n", f"            physical[i] = by_type[{_SWAP_TYPE}]\n"),),
        servers=TOPK1,
        expect="test_server_serves (head dims differ: likely a launch crash), else test_spec_metrics",
    ),
    Mutant(
        "draft-position-ahead",
        "positions",
        "RoPE position of every draft step one ahead of the last written target slot",
        (
            Site(
                _FKU,
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
            Site(_W2, _LOOP_POSITIONS, _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n"),
            Site(_W1, _LOOP_POSITIONS, _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n"),
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
                _SPU,
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
                _W2,
                "seed_prev_hidden = target_hidden.repeat_interleave(self.topk, dim=0)",
                "seed_prev_hidden = target_hidden.repeat(self.topk, 1)",
            ),
            Site(
                _W1,
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
                _FKU,
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
                _EAU,
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _SHIFT_TARGET,
            ),
            Site(
                _EAI,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _SHIFT_TARGET,
            ),
            Site(
                _EAI2,
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
            Site(_EAI, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n"),
            Site(_BRP, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n"),
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
        (Site(_MRP, "self.spec_num_forward_ct += bs\n", "self.spec_num_forward_ct += 2 * bs\n"),),
        servers=TOPK1,
        expect="test_spec_metrics and test_meta_info_fields_agree (avg_spec_accept_length "
        "inconsistent with per-request numbers)",
    ),
    Mutant(
        "draft-cuda-graph-skipped",
        "cuda-graph",
        "the Frozen-KV draft CUDA graph is never captured (the draft loop silently runs eagerly)",
        (
            Site(_W2, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
            Site(_W1, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
        ),
        servers=TOPK1,
        expect="test_cuda_graphs_captured (no draft capture line)",
    ),
    Mutant(
        "topk-parent-non-first",
        "tree-parent",
        "at topk > 1 a draft node whose parent is not its step's first-ranked node continues from the first-ranked "
        "node's hidden state (nodes under the first branch stay right)",
        (
            Site(
                _SPU,
                "selected_input_index = flat_cs // topk + batch_offsets",
                "selected_input_index = (flat_cs // topk).clamp(max=0) + batch_offsets",
            ),
        ),
        servers=DECOY_TOPK3,
        expect="test_decoy_accept_matches_prediction[decoy-mtp-topk3] (acceptance: the path "
        "through the second-ranked branch drafts wrong; the witness stays on branch 0)",
    ),
    Mutant(
        "verify-accept-all-greedy",
        "lossy-verify",
        "greedy verify accepts every draft without comparing it with the target's argmax (topk 1 chain)",
        (
            Site(
                _EAU,
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _ACCEPT_ALL,
            ),
            Site(
                _EAI,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _ACCEPT_ALL,
            ),
            Site(
                _EAI2,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _ACCEPT_ALL,
            ),
        ),
        servers=DECOY_TOPK1,
        expect="test_exact_pair_follows_rule[decoy-mtp-topk1] (mismatch: the decoys reach the "
        "output), test_decoy_accept_matches_prediction",
    ),
    Mutant(
        "verify-temperature-ignored",
        "sampled-verify",
        "sampled verify builds the target distribution at temperature 1 whatever the request asked",
        (
            Site(_EAU, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),  # 0.5.17
            Site(
                _EAU,
                "next_token_logits, temperatures=expanded_temperature\n",  # 0.5.23: sampling_softmax(...)
                "next_token_logits, temperatures=torch.ones_like(expanded_temperature)\n",
            ),
            Site(_EAI, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),  # 0.5.13
            Site(_EAI2, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),
        ),
        servers=SAMPLED_MTP,
        expect="test_sampled_distribution_matches_closed_form (mismatch)",
    ),
    Mutant(
        "verify-renorm-skipped",
        "sampled-verify",
        "sampled verify skips the top-k and top-p renormalisation of the target distribution",
        tuple(
            Site(m, f"target_probs = top_{x}_renorm_prob(", f"target_probs = (lambda probs, _{x}s: probs)(")
            for m in (_EAU, _EAI, _EAI2)
            for x in ("k", "p")
        ),
        servers=SAMPLED_MTP,
        expect="test_sampled_distribution_matches_closed_form (mismatch: tokens outside "
        "top-k/top-p appear, the kept ones lose mass)",
    ),
    Mutant(
        "verify-accept-threshold",
        "sampled-verify",
        "sampled verify accepts a draft when the coin is under twice its target probability (threshold_acc "
        "halved: the kernel accepts when coin <= prob_acc / threshold_acc)",
        (
            Site(
                _EAU,
                "threshold_acc=get_spec().speculative_accept_threshold_acc,",
                "threshold_acc=0.5 * get_spec().speculative_accept_threshold_acc,",
            ),
            Site(
                _EAI,
                "threshold_acc=get_global_server_args().speculative_accept_threshold_acc,",
                "threshold_acc=0.5 * get_global_server_args().speculative_accept_threshold_acc,",
            ),
            Site(
                _EAI2,
                "threshold_acc=get_global_server_args().speculative_accept_threshold_acc,",
                "threshold_acc=0.5 * get_global_server_args().speculative_accept_threshold_acc,",
            ),
        ),
        servers=SAMPLED_MTP,
        expect="test_sampled_distribution_matches_closed_form (mismatch: the drafter's tokens are over-represented)",
    ),
    Mutant(
        "metric-correct-drafts-bonus",
        "metric-fields",
        "each request's spec_num_correct_drafts also counts the bonus token of every verify step (the response's "
        "accept rate and draft count off by one per step; verify count, accept length and the server counter right)",
        (
            Site(
                _BRP,
                "req.spec_num_correct_drafts += num_correct_drafts\n",
                "req.spec_num_correct_drafts += num_correct_drafts + 1\n",
            ),
            Site(
                _EAI,
                "req.spec_num_correct_drafts += num_correct_drafts_this_req\n",
                "req.spec_num_correct_drafts += num_correct_drafts_this_req + 1\n",
            ),
        ),
        servers=TOPK1,
        expect="test_meta_info_fields_agree (accounting: histogram and tail rule disagree with "
        "spec_num_correct_drafts; test_spec_metrics does not read it)",
    ),
    # ----------------------------------------------------------------------------- the request surface
    # Each is reached only by requests the smoke tier's own never send (its greedy requests set ignore_eos, ask no
    # logprobs, no logit_bias; its sampled plan runs one temperature), or only in a mode one server runs.
    Mutant(
        "stop-match-at-step-end",
        "stops",
        "the token-based finish check puts a stop / EOS matched inside a verify step's accepted run at the step's "
        "last token (finished_len), so the accepted tokens after the stop stay in the output",
        (
            Site(
                _SB,
                "matched_pos = len(self.output_ids) - len(new_accepted_tokens) + i\n",
                "matched_pos = len(self.output_ids) - 1\n",
            ),
        ),  # Req._check_token_based_finish, 0.5.13-0.5.23
        servers=WITNESS_SURFACE,
        na_on=("0.5.13",),
        na_why="its Frozen-KV MTP verify appends accepted tokens one at a time and checks finish after each "
        "(eagle_info.py EagleVerifyInput.verify: update_finish_state() with one new token), so this edit of the "
        "multi-token position is an identity there (H200, 2026-12-02: survived, all 51 checks passed)",
        expect="the stops family's check on witness-mtp-topk1/topk3 (output must end at the stop token; MTP must "
        "equal witness-nomtp): a stop mid-run keeps up to 5 more chain tokens. No-MTP steps accept one "
        "token (unchanged); the tier's own requests set ignore_eos, so _check_token_based_finish returns "
        "before the loop and no old check reaches it",
    ),
    Mutant(
        "logprob-row-shift",
        "logprobs",
        "the logprobs of a verify step's accepted tokens are read from the logits row one node earlier (each "
        "accepted token scored under its predecessor's next-token distribution)",
        (
            Site(
                _LP17,
                "    gathered_logits = logits_output.next_token_logits[flat_accept_idx]\n",  # 0.5.17
                "    gathered_logits = logits_output.next_token_logits[flat_accept_idx - 1]\n",
            ),
            Site(
                _LP17,
                "        gathered_logits = next_token_logits[flat_accept_idx]\n",  # 0.5.23
                "        gathered_logits = next_token_logits[flat_accept_idx - 1]\n",
            ),
            Site(
                _LP13,
                "        torch.arange(len(batch_next_token_ids), device=batch.sampling_info.device),\n",  # 0.5.13
                "        (torch.arange(len(batch_next_token_ids), device=batch.sampling_info.device) - 1).clamp(min=0),"
                "\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        expect="the logprobs family's check (output_token_logprobs of MTP vs witness-nomtp): the witness puts "
        "its next token ~20 nats above the rest, so every verify-step token's logprob drops from ~0 to "
        "about -20 (0.5.17 / 0.5.23 also shift top_logprobs). Only return_logprob requests run this code: "
        "the old checks ask logprobs of the no-MTP servers alone",
    ),
    Mutant(
        "verify-temperature-row0",
        "mixed-sampling",
        "sampled verify applies the first request's temperature to every row of the batch (index [0] instead of "
        "per row)",
        (
            Site(
                _EAU,
                "sampling_info.temperatures, verify_input.draft_token_num, dim=0\n",  # 0.5.17, 0.5.23
                "sampling_info.temperatures[:1].expand_as(sampling_info.temperatures), verify_input.draft_token_num, "
                "dim=0\n",
            ),
            Site(
                _EAI,
                "sampling_info.temperatures, self.draft_token_num, dim=0\n",  # 0.5.13
                "sampling_info.temperatures[:1].expand_as(sampling_info.temperatures), self.draft_token_num, dim=0\n",
            ),
            Site(
                _EAI2,
                "sampling_info.temperatures, self.draft_token_num, dim=0\n",
                "sampling_info.temperatures[:1].expand_as(sampling_info.temperatures), self.draft_token_num, dim=0\n",
            ),
        ),
        servers=SAMPLED_MTP + (SAMPLED_NOMTP,),
        expect="the mixed-sampling family's check (groups of different temperatures in flight together, each "
        "held to its own closed form): a group then comes out at another group's temperature. The old "
        "sampled plan runs one temperature (0.7), so it is blind except for the few sampled rows that "
        "share a batch with a greedy request first in the batch (temperature 1.0)",
    ),
    Mutant(
        "sampled-bonus-greedy",
        "sampled-bonus",
        "after a sampled verify step that accepts every draft, the bonus token is the target's argmax instead of "
        "a sample from the target distribution",
        (
            Site(_EAU, _SAMPLE_END_17, _SAMPLE_END_17.replace("\n\n", "\n" + " " * 8 + _GREEDY_BONUS + "\n", 1)),
            Site(_EAU, _SAMPLE_END_23, " " * 8 + _GREEDY_BONUS + _SAMPLE_END_23),
            Site(_EAI, _SAMPLE_END_13, _SAMPLE_END_13.replace("\n\n", "\n" + " " * 12 + _GREEDY_BONUS + "\n", 1)),
            Site(_EAI2, _SAMPLE_END_13, _SAMPLE_END_13.replace("\n\n", "\n" + " " * 12 + _GREEDY_BONUS + "\n", 1)),
        ),
        servers=SAMPLED_MTP,
        expect="test_bonus_tokens_match_closed_form[sampled-mtp-topk1/topk3] (mismatch): in the sampled pair's "
        "second region every verify step accepts all five drafts, so every 6th token is a bonus token "
        "(1,008 per server), and each comes back as the spread law's most likely start (probability 0.59 / "
        "0.46 under the closed form: chi-square p ~1e-200). The ring's checks barely see it: there all "
        "five drafts are accepted in < 0.4 % of steps at topk 1 and a few percent at topk 3",
    ),
    Mutant(
        "no-overlap-seq-lens-dropped",
        "sched-modes",
        "the non-overlap scheduler does not carry the verify step's advanced seq_lens into the next iteration "
        "(the condition around the re-apply after the forward isolation inverted), so the drafter plans its "
        "positions and frozen KV over the prefill length for the rest of the request",
        (
            Site(_SCHED, _NO_OVERLAP_17, _NO_OVERLAP_17.replace("is not None:\n", "is None:\n")),  # 0.5.17
            Site(
                _SCHED,
                "if new_seq_lens is not None and new_seq_lens is not batch.seq_lens:\n",  # 0.5.23
                "if new_seq_lens is None and new_seq_lens is not batch.seq_lens:\n",
            ),
        ),
        servers=DECOY_NO_OVERLAP,
        na_on=("0.5.13",),
        na_why="its Frozen-KV MTP is the v1 worker: the spec-v2 scheduler relay this edits does not exist there",
        expect="test_decoy_accept_matches_prediction[decoy-mtp-topk3-no-overlap] and test_spec_metrics there "
        "(drafts read the KV of the prompt's last token: acceptance collapses; the output stays right, the "
        "target's next token depends on the current token only), while decoy-mtp-topk3 (overlap "
        "scheduler, future_map relay) passes. n.a. on 0.5.13: its Frozen-KV MTP is the v1 worker",
    ),
    Mutant(
        "eager-draft-kv-short",
        "sched-modes",
        "the eager (non-CUDA-graph) draft plans its frozen-KV attention over seq_lens - 1 target slots (the rope "
        "position's seq_lens - 1 taken for the KV length), so it never reads the last accepted token's KV",
        # 0.5.17+ only: intact 0.5.13 already dies on the first eager draft step (known_upstream.json
        # sglang-frozen-kv-mtp-eager-draft-crash; H200, 2026-12-02), so a fault there has nothing left to break
        (Site(_W2, _EAGER_META, _EAGER_SHORT),),
        servers=WITNESS_EAGER,
        na_on=("0.5.13",),
        na_why="its intact eager draft already kills the scheduler (known_upstream.json "
        "sglang-frozen-kv-mtp-eager-draft-crash), so a fault there has nothing left to break",
        expect="test_spec_metrics[witness-mtp-topk3-eager] (the witness drafter's query peaks on the last "
        "accepted token's key: without it the draft is wrong, acceptance drops below the exact floor in "
        "the batches above --cuda-graph-max-bs 2), while witness-mtp-topk3 (every batch <= 8 replays the "
        "captured graph, whose metadata comes from _init_frozen_kv_metadata_replay_cuda_graph) passes. n.a. on "
        "0.5.13: its intact eager draft crashes the scheduler",
    ),
    Mutant(
        "verify-logit-bias-dropped",
        "sampling-feats",
        "verify adds logit_bias out of place (add instead of add_), so the bias never reaches the target logits "
        "it verifies against",
        (
            Site(
                _EAU,
                "    if sampling_info.logit_bias is not None:\n        next_token_logits.add_(\n",  # 0.5.17/23
                "    if sampling_info.logit_bias is not None:\n        next_token_logits.add(\n",
            ),
            Site(
                _EAI,
                "            if sampling_info.logit_bias is not None:\n"  # 0.5.13
                "                logits_output.next_token_logits.add_(\n",
                "            if sampling_info.logit_bias is not None:\n"
                "                logits_output.next_token_logits.add(\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        expect="the sampling-features family's logit_bias check (greedy witness, MTP vs witness-nomtp): a bias "
        "that moves the argmax off the chain changes no-MTP's output, while MTP's verify keeps accepting "
        "the chain after the first (prefill-sampled) token. The old requests send no logit_bias "
        "(sampling_info.logit_bias is None)",
    ),
    Mutant(
        "greedy-row-top2-in-mixed-verify",
        "mixed-sampling",
        "a sampled verify batch renormalises every row to at least its top 2 tokens (top_ks clamped to >= 2), so a "
        "greedy request (top_k 1 at temperature 1.0, as sglang stores temperature 0) that shares the batch with "
        "sampled requests is sampled",
        (
            Site(
                _EAU,
                "sampling_info.top_ks, verify_input.draft_token_num, dim=0\n",  # 0.5.17, 0.5.23
                "sampling_info.top_ks.clamp(min=2), verify_input.draft_token_num, dim=0\n",
            ),
            Site(_EAI, "sampling_info.top_ks, self.draft_token_num, dim=0\n", _TOP2_13),  # 0.5.13
            Site(_EAI2, "sampling_info.top_ks, self.draft_token_num, dim=0\n", _TOP2_13),
        ),
        servers=SAMPLED_MTP,
        expect="test_mixed_greedy_follows_chain[sampled-mtp-topk1/topk3] (the mixed family's greedy requests are in "
        "flight with the hot and cold sampled groups, so their verify takes the sampled branch, where the top 2 "
        "offsets of the sampled pair at temperature 1.0 are 0.59 / 0.41 (sampled.token_distribution): a greedy "
        "request leaves the chain within a few tokens). Nothing else sees it: every other greedy request is in an "
        "all-greedy batch (argmax verify), and every sampled group's top-k is 3 or more",
    ),
    Mutant(
        "seeded-verify-coins-unseeded",
        "seeded",
        "verify draws its rejection and final-sampling coins from the global RNG even when the request carries a "
        "sampling_seed (the seeded branch of _verify_coins never taken), so two identical seeded requests diverge "
        "at their first sampled verify step",
        (
            Site(
                _EAU,
                "    if sampling_info.sampling_seed is not None:\n        return _seeded_verify_coins(\n",
                "    if False:  # the seeded coins never drawn\n        return _seeded_verify_coins(\n",
            ),
        ),
        servers=("sampled-mtp-topk1-no-overlap",),
        na_on=("0.5.13",),
        na_why="its verify has no seeded coins at all (docs/upstream/sglang-seeded-verify-coins.md), and its "
        "--enable-deterministic-inference server dies at CUDA-graph capture "
        "(sglang-deterministic-inference-gemma4-capture-crash)",
        expect="test_seeded_repeats_identical[sampled-mtp-topk1-no-overlap] (4 seeded repeats sent beside their "
        "originals: identical first token from the seeded sampler, then different tokens at the first verify step "
        "whose coin decides), while the closed-form checks on the same server pass: the coins stay uniform. n.a. "
        "on 0.5.13: no seeded verify coins to drop",
    ),
)


def catalogue_by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}


def select(ids: str | None, catalogue: tuple[Mutant, ...] = CATALOGUE) -> list[Mutant]:
    """The mutants named in ``ids`` ("a,b"), in catalogue order; all when empty. MutantsError on unknown ids."""
    if not ids or not ids.strip():
        return list(catalogue)
    wanted = comma_list(ids)
    known = [m.id for m in catalogue]
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise MutantsError(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [m for m in catalogue if m.id in wanted]


# --------------------------------------------------------------------------------------------- applying
def module_file(pkg_dir: Path, module: str) -> Path:
    """sglang.srt.x.y -> <pkg_dir>/srt/x/y.py"""
    parts = module.split(".")
    return Path(pkg_dir).joinpath(*parts[1:]).with_suffix(".py")


@dataclass
class SiteResult:
    site: Site
    file: str  # relative to the package's parent, e.g. sglang/srt/speculative/spec_utils.py
    count: int  # anchor occurrences in the installed file; -1: no such file

    @property
    def status(self) -> str:
        return {-1: "no such file", 0: "anchor absent", 1: "applied"}.get(
            self.count, f"anchor found {self.count} times"
        )

    @property
    def applied(self) -> bool:
        return self.count == 1


@dataclass
class Application:
    """A mutant against one installed sglang: which sites applied, and the patched modules."""

    mutant: Mutant
    sites: list[SiteResult]
    modules: dict[str, dict] = field(default_factory=dict)  # name -> origin, rel, sha256, original, patched
    error: str | None = None  # a patched module that does not compile (a catalogue bug)
    by_design: str | None = None  # n.a. on this release by design (Mutant.na_on), and why: nothing is patched

    @property
    def applicable(self) -> bool:
        return self.by_design is None and any(s.applied for s in self.sites)

    @property
    def files(self) -> list[str]:
        return sorted({s.file for s in self.sites if s.applied})

    def reason(self) -> str:
        """Why it is not applicable (each site's outcome), or which files it patches."""
        if self.applicable:
            return "patches " + ", ".join(self.files)
        if self.by_design:
            return self.by_design
        return "; ".join(f"{s.file}: {s.status}" for s in self.sites)


def apply(mutant: Mutant, pkg_dir: Path) -> Application:
    """Apply ``mutant`` to the sources under ``pkg_dir`` (an installed ``sglang`` folder), in memory."""
    pkg_dir = Path(pkg_dir)
    version = sglang_version(pkg_dir)
    release = re.match(r"\d+\.\d+\.\d+", version or "")
    if release and release.group(0) in mutant.na_on:
        return Application(mutant, [], by_design=f"n.a. by design on sglang {version}: {mutant.na_why}")
    app = Application(mutant, [])
    texts: dict[str, str] = {}
    for site in mutant.sites:
        path = module_file(pkg_dir, site.module)
        rel = str(path.relative_to(pkg_dir.parent))
        if site.module not in texts:
            try:
                texts[site.module] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                app.sites.append(SiteResult(site, rel, -1))
                continue
        original = texts[site.module]
        count = original.count(site.anchor)
        app.sites.append(SiteResult(site, rel, count))
        if count != 1:
            continue
        mod = app.modules.setdefault(
            site.module,
            {
                "origin": str(path),
                "rel": rel,
                "sha256": hashlib.sha256(original.encode("utf-8")).hexdigest(),
                "original": original,
                "patched": original,
            },
        )
        if mod["patched"].count(site.anchor) != 1:
            app.error = f"{rel}: sites of {mutant.id} overlap (anchor no longer unique after an earlier site)"
            continue
        mod["patched"] = mod["patched"].replace(site.anchor, site.replacement, 1)
    for mod in app.modules.values():
        if mod["patched"] == mod["original"]:
            app.error = app.error or f"{mod['rel']}: the replacement leaves the module unchanged"
        try:
            compile(mod["patched"], mod["origin"], "exec", dont_inherit=True)
        except SyntaxError as exc:
            app.error = app.error or f"{mod['rel']}:{exc.lineno}: patched module does not compile: {exc.msg}"
    return app


def hook_payload(app: Application) -> dict:
    """What mutant_hook/sitecustomize.py reads from $MTPMATRIX_MUTANT."""
    return {
        "mutant": app.mutant.id,
        "modules": {
            name: {"origin": m["origin"], "sha256": m["sha256"], "source": m["patched"]}
            for name, m in app.modules.items()
        },
    }


def diff(app: Application) -> str:
    out = []
    for m in app.modules.values():
        out += difflib.unified_diff(
            m["original"].splitlines(keepends=True),
            m["patched"].splitlines(keepends=True),
            fromfile=f"a/{m['rel']}",
            tofile=f"b/{m['rel']}",
            n=2,
        )
    return "".join(out)


# --------------------------------------------------------------------------------------------- the installed sglang
def find_sglang(python: str = sys.executable) -> Path | None:
    from mtpmatrix.serving.processes import sglang_package_dir

    return sglang_package_dir(python)


def sglang_version(pkg_dir: Path) -> str | None:
    """From sglang/_version.py (setuptools-scm), else the dist-info folder next to the package; no import."""
    pkg_dir = Path(pkg_dir)
    for name in ("_version.py", "version.py"):
        try:
            m = re.search(
                r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                (pkg_dir / name).read_text(encoding="utf-8"),
                re.M,
            )
        except OSError:
            continue
        if m:
            return m.group(1)
    for d in sorted(pkg_dir.parent.glob("sglang-*.dist-info")):
        return d.name[len("sglang-") : -len(".dist-info")]
    return None
