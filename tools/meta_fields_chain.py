"""The per-request accounting chain of the installed sglang, run on the CPU: its scheduler's spec-v2 settle step
(``SchedulerBatchResultProcessor._resolve_spec_v2_tokens``, the code that bumps each request's verify count, correct
drafts and histogram) over a request's verify steps, then its tokenizer manager's meta_info fields, then
``meta_fields.disagreements`` -- once as installed (the fields must agree, tail rule included) and once with the
catalogue's ``metric-correct-drafts-bonus`` applied to that module (they must not). A diagnostic for what the smoke
check ``test_meta_info_fields_agree`` models, not a check; the request objects are stand-ins carrying what the settle
step reads in 0.5.13, 0.5.17 and 0.5.23 (0.5.13 drafts Frozen-KV MTP on the v1 verify, not this path).

    PYTHONPATH=src .nox/gemma4_mtp-sglang-0-5-17/bin/python tools/meta_fields_chain.py
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import sglang
import torch
from sglang.srt.managers.schedule_batch import Req

from mtpmatrix.core import settings
from mtpmatrix.faults import catalogue, mutation
from mtpmatrix.tiers.compat import meta_fields

BRP = "sglang.srt.managers.scheduler_components.batch_result_processor"
STEPS, DRAFT_TOKENS, MAX_NEW = settings.NUM_STEPS, settings.DRAFT_TOKENS[1], 32
# tokens each verify step accepts (drafts + bonus): witness-like, mixed, random-pair-like
REQUESTS = {"witness": [6] * 8, "mixed": [6, 1, 3, 2, 6, 4, 5, 1, 6, 6, 6], "random": [1] * 40}

tm = importlib.import_module("sglang.srt.managers.tokenizer_manager")
if hasattr(tm, "get_spec"):  # 0.5.23 reads the draft-token count from the published spec args
    tm.get_spec = lambda: SimpleNamespace(speculative_num_draft_tokens=DRAFT_TOKENS)


def settle_module(mutated: bool):
    """The installed batch_result_processor, or its text with metric-correct-drafts-bonus applied."""
    if not mutated:
        return importlib.import_module(BRP)
    app = mutation.apply(catalogue.catalogue_by_id()["metric-correct-drafts-bonus"], Path(sglang.__file__).parent)
    mod = types.ModuleType(BRP + "_mutant")
    mod.__file__ = app.modules[BRP]["origin"]
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(app.modules[BRP]["patched"], mod.__file__, "exec"), mod.__dict__)
    return mod


def meta_info(mod, accept_lens: list[int]) -> dict:
    """One request through the settle step and the tokenizer manager: its response's meta_info."""
    owner = SimpleNamespace(
        advance_grammar_fsm=lambda result, batch: None,
        model_worker=SimpleNamespace(on_verify_complete_cpu=lambda *a, **k: None),
        metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=lambda *a, **k: None),
    )
    req = SimpleNamespace(
        is_retracted=False,
        grammar=None,
        kv_committed_len=0,
        kv=SimpleNamespace(kv_committed_len=0),
        spec_verify_ct=0,
        spec_num_correct_drafts=0,
        spec_correct_drafts_histogram=[],
        spec_num_block_accept_tokens=0,
        spec_num_cap_tokens=0,
        output=[0],
        done=False,
    )
    req.finished = lambda: req.done
    req.update_spec_correct_drafts_histogram = lambda n: Req.update_spec_correct_drafts_histogram(req, n)
    for accepted in accept_lens:
        result = SimpleNamespace(
            next_token_ids=torch.arange(DRAFT_TOKENS),
            accept_lens=torch.tensor([accepted]),
            block_accept_lens=None,
            cap_lens=None,
            grammar_retained_tokens=None,
            speculative_num_draft_tokens=DRAFT_TOKENS,
            speculative_output_stride=DRAFT_TOKENS,
            num_non_draft_tokens_per_req=1,
        )
        tokens = mod.SchedulerBatchResultProcessor._resolve_spec_v2_tokens(owner, result, SimpleNamespace(reqs=[req]))
        req.output += tokens[0][: MAX_NEW - len(req.output)]  # what passes max_new_tokens is dropped
        req.done = len(req.output) >= MAX_NEW
        if req.done:
            break
    recv = SimpleNamespace(
        spec_verify_ct=[req.spec_verify_ct],
        spec_num_correct_drafts=[req.spec_num_correct_drafts],
        completion_tokens=[len(req.output)],
        spec_correct_drafts_histogram=[req.spec_correct_drafts_histogram],
        spec_num_cap_tokens=None,
        spec_num_block_accept_tokens=None,
        spec_cap_lens_histogram=None,
    )
    meta = {"completion_tokens": len(req.output)}
    tm.TokenizerManager._calculate_spec_decoding_metrics(
        SimpleNamespace(server_args=SimpleNamespace(speculative_num_draft_tokens=DRAFT_TOKENS)), meta, recv, 0
    )
    return meta


def main() -> int:
    fields = meta_fields.documented_fields()
    wrong = 0
    for mutated in (False, True):
        mod = settle_module(mutated)
        for name, accept_lens in REQUESTS.items():
            meta = meta_info(mod, accept_lens)
            why = meta_fields.disagreements(meta, fields=fields, draft_tokens=DRAFT_TOKENS, steps=STEPS)
            wrong += bool(why) != mutated
            counts = {k: meta[k] for k in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts")}
            print(
                sglang.__version__,
                "mutant" if mutated else "intact",
                name,
                counts,
                "DISAGREE: " + "; ".join(why) if why else "AGREE",
            )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
