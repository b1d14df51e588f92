"""Mutants seen only by the decoy and sampled servers: a tree parent off the first branch, a verify that takes every
draft, a sampled verify without the request's temperature, top-k/top-p or accept threshold, a miscounted
per-request metric field."""

from __future__ import annotations

from mtpmatrix.faults.catalogue.servers import DECOY_TOPK1, DECOY_TOPK3, SAMPLED_MTP, TOPK1
from mtpmatrix.faults.catalogue.sglang_modules import (
    BATCH_RESULT_PROCESSOR,
    EAGLE_INFO,
    EAGLE_INFO_V2,
    EAGLE_UTILS,
    SPEC_UTILS,
)
from mtpmatrix.faults.mutation import Mutant, Site

# Greedy verify that takes every draft: the target's prediction at each chain position replaced by the next draft
# (topk 1 layout: position 0 the last verified token, 1..steps the drafts), the bonus from the target's last row.
_ACCEPT_ALL = (
    "; target_predict = torch.cat([candidates[:, 1:].to(target_predict.dtype), target_predict[:, -1:]], dim=1)\n"
)

DECOY_AND_SAMPLED_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "topk-parent-non-first",
        "tree-parent",
        "at topk > 1 a draft node whose parent is not its step's first-ranked node continues from the first-ranked "
        "node's hidden state (nodes under the first branch stay right)",
        (
            Site(
                SPEC_UTILS,
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
                EAGLE_UTILS,
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _ACCEPT_ALL,
            ),
            Site(
                EAGLE_INFO,
                "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
                "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _ACCEPT_ALL,
            ),
            Site(
                EAGLE_INFO_V2,
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
            Site(
                EAGLE_UTILS, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"
            ),  # 0.5.17
            Site(
                EAGLE_UTILS,
                "next_token_logits, temperatures=expanded_temperature\n",  # 0.5.23: sampling_softmax(...)
                "next_token_logits, temperatures=torch.ones_like(expanded_temperature)\n",
            ),
            Site(EAGLE_INFO, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),  # 0.5.13
            Site(EAGLE_INFO_V2, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),
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
            for m in (EAGLE_UTILS, EAGLE_INFO, EAGLE_INFO_V2)
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
                EAGLE_UTILS,
                "threshold_acc=get_spec().speculative_accept_threshold_acc,",
                "threshold_acc=0.5 * get_spec().speculative_accept_threshold_acc,",
            ),
            Site(
                EAGLE_INFO,
                "threshold_acc=get_global_server_args().speculative_accept_threshold_acc,",
                "threshold_acc=0.5 * get_global_server_args().speculative_accept_threshold_acc,",
            ),
            Site(
                EAGLE_INFO_V2,
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
                BATCH_RESULT_PROCESSOR,
                "req.spec_num_correct_drafts += num_correct_drafts\n",
                "req.spec_num_correct_drafts += num_correct_drafts + 1\n",
            ),
            Site(
                EAGLE_INFO,
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
)
