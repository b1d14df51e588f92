"""Mutants seen only by the request families of ``mtpmatrix.tiers.surface`` or by one server's scheduler / graph
mode: a stop inside an accepted run, logprobs of the wrong node, one request's temperature for the whole batch, a
greedy bonus token at T > 0, a non-overlap scheduler that drops the advanced seq_lens, an eager draft that misses
the last KV slot, a verify without logit_bias, a greedy request sampled in a mixed verify batch, seeded requests'
verify coins unseeded, hidden states of the node after each accepted one; and the other request shapes (issue #38
item 3): verify nodes left outside the grammar, a stop_regex placed at the step's end, token_ids_logprob read one
node early, stream events that carry only the last token of each accepted run."""

from __future__ import annotations

from mtpmatrix.faults.catalogue.servers import (
    DECOY_NO_OVERLAP,
    SAMPLED_MTP,
    SAMPLED_NOMTP,
    WITNESS_EAGER,
    WITNESS_SURFACE,
)
from mtpmatrix.faults.catalogue.sglang_modules import (
    BATCH_RESULT_PROCESSOR,
    EAGLE_INFO,
    EAGLE_INFO_V2,
    EAGLE_UTILS,
    FROZEN_KV_MTP_WORKER_V2,
    LAYERS_UTILS_LOGPROB,
    LOGPROB_PROCESSOR,
    OUTPUT_STREAMER,
    SCHEDULE_BATCH,
    SCHEDULER,
)
from mtpmatrix.faults.mutation import Mutant, Site

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

REQUEST_SURFACE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "stop-match-at-step-end",
        "stops",
        "the token-based finish check puts a stop / EOS matched inside a verify step's accepted run at the step's "
        "last token (finished_len), so the accepted tokens after the stop stay in the output",
        (
            Site(
                SCHEDULE_BATCH,
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
                LOGPROB_PROCESSOR,
                "    gathered_logits = logits_output.next_token_logits[flat_accept_idx]\n",  # 0.5.17
                "    gathered_logits = logits_output.next_token_logits[flat_accept_idx - 1]\n",
            ),
            Site(
                LOGPROB_PROCESSOR,
                "        gathered_logits = next_token_logits[flat_accept_idx]\n",  # 0.5.23
                "        gathered_logits = next_token_logits[flat_accept_idx - 1]\n",
            ),
            Site(
                LAYERS_UTILS_LOGPROB,
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
                EAGLE_UTILS,
                "sampling_info.temperatures, verify_input.draft_token_num, dim=0\n",  # 0.5.17, 0.5.23
                "sampling_info.temperatures[:1].expand_as(sampling_info.temperatures), verify_input.draft_token_num, "
                "dim=0\n",
            ),
            Site(
                EAGLE_INFO,
                "sampling_info.temperatures, self.draft_token_num, dim=0\n",  # 0.5.13
                "sampling_info.temperatures[:1].expand_as(sampling_info.temperatures), self.draft_token_num, dim=0\n",
            ),
            Site(
                EAGLE_INFO_V2,
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
            Site(EAGLE_UTILS, _SAMPLE_END_17, _SAMPLE_END_17.replace("\n\n", "\n" + " " * 8 + _GREEDY_BONUS + "\n", 1)),
            Site(EAGLE_UTILS, _SAMPLE_END_23, " " * 8 + _GREEDY_BONUS + _SAMPLE_END_23),
            Site(EAGLE_INFO, _SAMPLE_END_13, _SAMPLE_END_13.replace("\n\n", "\n" + " " * 12 + _GREEDY_BONUS + "\n", 1)),
            Site(
                EAGLE_INFO_V2, _SAMPLE_END_13, _SAMPLE_END_13.replace("\n\n", "\n" + " " * 12 + _GREEDY_BONUS + "\n", 1)
            ),
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
            Site(SCHEDULER, _NO_OVERLAP_17, _NO_OVERLAP_17.replace("is not None:\n", "is None:\n")),  # 0.5.17
            Site(
                SCHEDULER,
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
        (Site(FROZEN_KV_MTP_WORKER_V2, _EAGER_META, _EAGER_SHORT),),
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
                EAGLE_UTILS,
                "    if sampling_info.logit_bias is not None:\n        next_token_logits.add_(\n",  # 0.5.17/23
                "    if sampling_info.logit_bias is not None:\n        next_token_logits.add(\n",
            ),
            Site(
                EAGLE_INFO,
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
                EAGLE_UTILS,
                "sampling_info.top_ks, verify_input.draft_token_num, dim=0\n",  # 0.5.17, 0.5.23
                "sampling_info.top_ks.clamp(min=2), verify_input.draft_token_num, dim=0\n",
            ),
            Site(EAGLE_INFO, "sampling_info.top_ks, self.draft_token_num, dim=0\n", _TOP2_13),  # 0.5.13
            Site(EAGLE_INFO_V2, "sampling_info.top_ks, self.draft_token_num, dim=0\n", _TOP2_13),
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
                EAGLE_UTILS,
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
    Mutant(
        "hidden-states-next-node",
        "hidden-states",
        "a verify step's returned hidden states are read one node late (rows start + 1 .. start + accept_len of the "
        "verify output in place of start .. start + accept_len - 1): each accepted token gets the hidden state of "
        "the node after it, the count stays right",
        (
            Site(
                BATCH_RESULT_PROCESSOR,
                "                hidden_states[start : start + accept_len].cpu().tolist()\n",
                "                hidden_states[start + 1 : start + accept_len + 1].cpu().tolist()\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        na_on=("0.5.13",),
        na_why="its spec-v1 path appends one row per verify step (logits_output.hidden_states[i]), not a slice of "
        "the accepted run: no such read to shift",
        expect="test_hidden_states_as_predicted[witness-mtp-topk1/topk3] (each decode row is the next input's: "
        "runs at +1 against the witness's prediction, which no entry takes) and test_hidden_states_match_no_mtp "
        "(row by row against the witness without MTP)",
    ),
    Mutant(
        "hidden-states-prefill-offset-asking-only",
        "hidden-states",
        "the prefill's hidden-state offset advances only past requests that ask (0.5.13's own mechanism, fixed in "
        "0.5.17): an asking request prefilled after a plain one in a batch gets that one's prompt rows",
        (
            Site(
                BATCH_RESULT_PROCESSOR,
                "            if not store or not req.return_hidden_states:\n                return hidden_state_offset\n",
                "            if not store or not req.return_hidden_states:\n"
                "                return hidden_state_offset - extend_input_len  # a plain request's rows not skipped\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        na_on=("0.5.13",),
        na_why="intact 0.5.13 (to 0.5.16) hands prefill rows out so: known upstream "
        "(sglang-0513-hidden-states-prefill-offset-past-plain-requests), nothing to inject",
        expect="test_hidden_states_as_predicted on every witness server where a plain request leads an asking one in "
        "a prefill batch (plain-85 before hidden-145 in the family's own batch): prompt rows that are another "
        "prompt's, named against the prediction; no entry takes them on 0.5.17+",
    ),
    Mutant(
        "grammar-verify-unmasked",
        "grammar",
        "verify samples the tree's nodes from logits the grammar mask was never applied to (the vocab mask built for "
        "each node's grammar state, then skipped), so a verify step accepts the drafted token where the grammar "
        "forces another",
        (
            Site(
                EAGLE_UTILS,
                "    if grammar_mask is not None:\n        grammar_mask.apply(next_token_logits)\n",  # 0.5.17/23
                "    if grammar_mask is not None and False:  # verify nodes left unmasked\n"
                "        grammar_mask.apply(next_token_logits)\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        na_on=("0.5.13",),
        na_why="its verify re-raises the grammar's refusal of an accepted token (eagle_info.py "
        "EagleVerifyInput.verify: accept_token ... raise e), so an unmasked verify kills the scheduler: a crash "
        "any check sees, not a fault for the structured family to find",
        expect="test_structured_as_predicted[witness-mtp-topk1/topk3] and test_structured_match_no_mtp: "
        "at a forced character the witness's drafts (and the target's unmasked argmax) are the +1 chain, so verify "
        "accepts a token the grammar refuses; sglang's grammar advance then aborts the request "
        "(batch_result_processor._accept_grammar_tokens: ValueError -> FINISH_ABORT), and the output is cut short "
        "of its predicted text with finish_reason abort. The first token (prefill, masked by the plain sampler) "
        "stays right; witness-nomtp passes. No old request carries a grammar",
    ),
    Mutant(
        "stop-regex-at-step-end",
        "stop-regex",
        "a stop_regex matched inside a verify step's accepted run finishes the request at the step's last token "
        "(finished_len = len(output_ids)) instead of at the token where the match completes",
        (
            Site(
                SCHEDULE_BATCH,
                "                        self.finished_len = self._locate_str_stop_finished_len(\n"  # 0.5.17
                "                            new_accepted_len, stop_regex=stop_regex_str\n"
                "                        )\n",
                "                        self.finished_len = len(self.output_ids)\n",
            ),
            Site(
                SCHEDULE_BATCH,
                "                        self.finished_len = finished_len\n",  # 0.5.23
                "                        self.finished_len = len(self.output_ids)\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        na_on=("0.5.13",),
        na_why="its Frozen-KV MTP verify appends accepted tokens one at a time and checks finish after each "
        "(eagle_info.py EagleVerifyInput.verify: update_finish_state() per token), and its _check_str_based_finish "
        "has no position to locate: no such edit exists there",
        expect="test_stop_regex_as_predicted[witness-mtp-topk1/topk3] (each output ends where its regex first "
        "matches, 16 tokens for the predicted cases) and test_stop_regex_match_no_mtp: the tokens accepted after the "
        "match in the same step stay in the output. No-MTP steps accept one token, where the step's last token is "
        "the match (unchanged). No old request sends stop_regex",
    ),
    Mutant(
        "ids-logprob-node-early",
        "ids-logprob",
        "token_ids_logprob of a verify step's accepted tokens is read from the logprob row one node earlier (rows "
        "rolled by one), while output_token_logprobs keeps the right rows",
        (
            Site(
                LOGPROB_PROCESSOR,
                "            gathered_logprobs, token_ids_logprobs_expanded, no_copy_to_cpu=True\n",  # 0.5.17/23
                "            gathered_logprobs.roll(1, dims=0), token_ids_logprobs_expanded, no_copy_to_cpu=True\n",
            ),
            Site(
                LAYERS_UTILS_LOGPROB,
                "        ) = get_token_ids_logprobs(\n"  # 0.5.13: add_output_logprobs_for_spec_v1
                "            logprobs,\n"
                "            token_ids_logprobs_repeat_interleaved,\n",
                "        ) = get_token_ids_logprobs(\n"
                "            logprobs.roll(1, dims=0),\n"
                "            token_ids_logprobs_repeat_interleaved,\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        expect="test_token_ids_logprob_as_predicted[witness-mtp-topk1/topk3] (at each output position the asked "
        "id equal to the output token has logprob >= -0.216, every other asked id <= -7.66; and within "
        "logprobs.TOLERANCE_NATS of witness-nomtp: test_token_ids_logprob_match_no_mtp): the asked ids at an accepted-draft or bonus position (3, 12, "
        "13) get the row of the position before, where the witness's peak is the previous token, ~20 nats away. "
        "The logprobs family asks no token ids (sampling_info.token_ids_logprobs None), so it is blind",
    ),
    Mutant(
        "stream-run-last-token-only",
        "streaming",
        "a streaming request's event carries only the newest token of the tokens produced since the last event "
        "(output_ids[-1:] in place of output_ids[send_token_offset:]), as if every step produced one token: under "
        "MTP the rest of each accepted run never reaches the client's output_ids",
        (
            Site(
                OUTPUT_STREAMER,
                "        self.output_ids.append(output_ids_[send_token_offset:])\n",  # 0.5.13-0.5.23
                "        self.output_ids.append(\n"
                "            output_ids_[len(output_ids_) - 1 :] if req.stream else output_ids_[send_token_offset:]\n"
                "        )\n",
            ),
        ),
        servers=WITNESS_SURFACE,
        expect="test_streaming_as_predicted[witness-mtp-topk1/topk3] (the /generate stream's last event's "
        "output_ids must equal the non-streamed answer's) and test_streaming_match_no_mtp: with 6 tokens per verify step a 32-token stream "
        "reassembles to about 7. witness-nomtp passes (one token per event either way); text and the OpenAI "
        "streams stay right (the detokenizer has its own offset). No old request streams",
    ),
)
