"""The request-surface mutants of the fault-injection catalogue (stops, logprobs, mixed sampling, the sampled bonus
token, the non-overlap scheduler and eager draft modes, sampling features): where each applies, what each edit
does, and that the servers it names are the ones whose checks can see it."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from mtpmatrix.core.smoke_servers import SMOKE_SERVERS
from mtpmatrix.faults import catalogue as C
from mtpmatrix.faults import mutation as F
from mtpmatrix.faults.catalogue import request_surface
from mtpmatrix.faults.catalogue import servers as CS

REPO = Path(__file__).resolve().parents[2]
ORIGINAL = (
    "handoff-block-first",
    "handoff-stale-by-one",
    "kv-layer-first-of-type",
    "kv-layer-type-swap",
    "draft-position-ahead",
    "draft-position-advanced",
    "topk-parent-hidden",
    "topk-expand-seed-rows",
    "topk-expand-kv-rows",
    "verify-target-row-shift",
    "accept-count-request",
    "accept-count-server",
    "draft-cuda-graph-skipped",
    "topk-parent-non-first",
    "verify-accept-all-greedy",
    "verify-temperature-ignored",
    "verify-renorm-skipped",
    "verify-accept-threshold",
    "metric-correct-drafts-bonus",
)
SURFACE = {  # mutant -> (category, files patched on 0.5.13, on 0.5.17, on 0.5.23); None: n.a. by design
    # n.a. on 0.5.13 though its anchor is there: that verify checks finish one token at a time (an identity edit)
    "stop-match-at-step-end": ("stops", None, {"schedule_batch.py"}, {"schedule_batch.py"}),
    "logprob-row-shift": ("logprobs", {"logprob.py"}, {"logprob_processor.py"}, {"logprob_processor.py"}),
    "verify-temperature-row0": (
        "mixed-sampling",
        {"eagle_info.py", "eagle_info_v2.py"},
        {"eagle_utils.py"},
        {"eagle_utils.py"},
    ),
    "sampled-bonus-greedy": (
        "sampled-bonus",
        {"eagle_info.py", "eagle_info_v2.py"},
        {"eagle_utils.py"},
        {"eagle_utils.py"},
    ),
    "no-overlap-seq-lens-dropped": ("sched-modes", None, {"scheduler.py"}, {"scheduler.py"}),
    "eager-draft-kv-short": (
        "sched-modes",
        None,  # intact 0.5.13's eager draft crashes (known upstream): nothing to inject into
        {"frozen_kv_mtp_worker_v2.py"},
        {"frozen_kv_mtp_worker_v2.py"},
    ),
    "verify-logit-bias-dropped": ("sampling-feats", {"eagle_info.py"}, {"eagle_utils.py"}, {"eagle_utils.py"}),
    "greedy-row-top2-in-mixed-verify": (
        "mixed-sampling",
        {"eagle_info.py", "eagle_info_v2.py"},
        {"eagle_utils.py"},
        {"eagle_utils.py"},
    ),
    "seeded-verify-coins-unseeded": ("seeded", None, {"eagle_utils.py"}, {"eagle_utils.py"}),  # 0.5.13: no seeded coins
    # 0.5.13's spec-v1 path appends one row per verify step: no slice to shift
    "hidden-states-next-node": ("hidden-states", None, {"batch_result_processor.py"}, {"batch_result_processor.py"}),
}
RELEASES = ("0.5.13", "0.5.17", "0.5.23")


def test_the_original_mutants_stay_first_and_unchanged_in_kind():
    assert tuple(m.id for m in C.CATALOGUE[: len(ORIGINAL)]) == ORIGINAL
    assert all(m.na_on == () for m in C.CATALOGUE[: len(ORIGINAL)])
    # then the request-surface mutants; issue #38's after them (tests/unit/test_catalogue_long_shapes.py)
    assert [m.id for m in C.CATALOGUE[len(ORIGINAL) :]][: len(SURFACE)] == list(SURFACE)


def test_every_surface_class_has_its_category_and_a_complete_entry():
    by_id = C.catalogue_by_id()
    for mid, (category, *_files) in SURFACE.items():
        m = by_id[mid]
        assert m.category == category and category in F.CATEGORIES, mid
        assert m.sites and m.models and m.expect and m.servers, mid
        assert len(F.CATEGORIES[category]) and len(category) <= 15  # the --list column


def test_surface_mutants_launch_the_servers_their_checks_compare():
    known = {s.name for s in SMOKE_SERVERS}
    by_id = C.catalogue_by_id()
    assert {CS.WITNESS_NOMTP, CS.SAMPLED_NOMTP, *CS.DECOY_NO_OVERLAP, *CS.WITNESS_EAGER} <= known
    for mid in SURFACE:
        assert set(by_id[mid].servers) <= known, mid
    # MTP-equals-no-MTP checks need the no-MTP witness in the same suite
    for mid in ("stop-match-at-step-end", "logprob-row-shift", "verify-logit-bias-dropped"):
        assert set(by_id[mid].servers) == {"witness-mtp-topk1", "witness-mtp-topk3", "witness-nomtp"}, mid
    assert "sampled-nomtp" in by_id["verify-temperature-row0"].servers
    # a mode's server beside its default twin: one suite shows which of the two sees the fault
    assert by_id["no-overlap-seq-lens-dropped"].servers == ("decoy-mtp-topk3-no-overlap", "decoy-mtp-topk3")
    assert by_id["eager-draft-kv-short"].servers == ("witness-mtp-topk3-eager", "witness-mtp-topk3")
    assert by_id["no-overlap-seq-lens-dropped"].na_on == ("0.5.13",)


# --------------------------------------------------------------------------------------------- release forms
# Excerpts of the installed sources (verbatim lines around each anchor), enough for every site to find its anchor.
_SB = """\
class Req:
    def _check_token_based_finish(self, new_accepted_tokens):
        if self.sampling_params.ignore_eos:
            return False
        matched_eos = False
        for i, token_id in enumerate(new_accepted_tokens):
            if self.sampling_params.stop_token_ids:
                matched_eos |= token_id in self.sampling_params.stop_token_ids
            if self.eos_token_ids:
                matched_eos |= token_id in self.eos_token_ids
            if matched_eos:
                self.finished_reason = ("matched", token_id)
                matched_pos = len(self.output_ids) - len(new_accepted_tokens) + i
                self.finished_len = matched_pos + 1
                return True
        return False
"""
_LP13 = """\
def add_output_logprobs_for_spec_v1(batch, res, logits_output=None):
    logits_output.next_token_logprobs = logprobs[
        torch.arange(len(batch_next_token_ids), device=batch.sampling_info.device),
        batch_next_token_ids,
    ]
"""
_LP17 = """\
def compute_spec_v2_logprobs(batch, logits_output, predict, accept_index, speculative_num_steps):
    flat_accept_idx = accept_index.long().reshape(-1)
    gathered_logits = logits_output.next_token_logits[flat_accept_idx]
"""
_LP23 = """\
def compute_spec_logprobs(batch, next_token_logits, predict, accept_index):
    if True:
        flat_accept_idx = accept_index.long().reshape(-1)
        gathered_logits = next_token_logits[flat_accept_idx]
"""
_V1 = """\
class EagleVerifyInput:
    def verify(self, batch, logits_output):
        bs = self.retrieve_index.shape[0]
        if True:
            if sampling_info.logit_bias is not None:
                logits_output.next_token_logits.add_(
                    torch.repeat_interleave(
                        sampling_info.logit_bias, self.draft_token_num, dim=0
                    )
                )
        else:
            expanded_temperature = torch.repeat_interleave(
                sampling_info.temperatures, self.draft_token_num, dim=0
            )  # (bs * draft_token_num, 1)
            if sampling_info.need_top_k_sampling:
                target_probs = top_k_renorm_prob(
                    target_probs,
                    torch.repeat_interleave(
                        sampling_info.top_ks, self.draft_token_num, dim=0
                    ),
                )  # (bs * draft_token_num, vocab_size)
            tree_speculative_sampling_target_only(
                predicts=predict,  # mutable
                deterministic=True,
            )

            # Sync sampling results across TP ranks: different GPUs may
            tp_group = None
"""
_V2 = """\
def _verify_coins(*, sampling_info, seq_lens, draft_token_num, candidates, device):
    if sampling_info.sampling_seed is not None:
        return _seeded_verify_coins(
            sampling_seed=sampling_info.sampling_seed,
        )
    coins = torch.rand_like(candidates, dtype=torch.float32, device=device)


def eagle_sample(verify_input, batch, logits_output, grammar_mask=None):
    bs = len(batch.seq_lens)
    if sampling_info.logit_bias is not None:
        next_token_logits.add_(
            torch.repeat_interleave(
                sampling_info.logit_bias, verify_input.draft_token_num, dim=0
            )
        )
    else:
        expanded_temperature = torch.repeat_interleave(
            sampling_info.temperatures, verify_input.draft_token_num, dim=0
        )  # (bs * num_draft_tokens, 1)
        if sampling_info.need_top_k_sampling:
            target_probs = top_k_renorm_prob(
                target_probs,
                torch.repeat_interleave(
                    sampling_info.top_ks, verify_input.draft_token_num, dim=0
                ),
            )  # (bs * num_draft_tokens, vocab_size)
        sampling_fn(
            predicts=predict,  # mutable
            deterministic=True,
        )
TAIL"""
_V2_TAIL_17 = """
        # Sync sampling results across TP ranks: different GPUs may
        tp_group = None
"""
_V2_TAIL_23 = """        del (
            expanded_temperature,
            target_probs,
        )
"""
_W = """\
class FrozenKVMTPDraftWorker:
    def _init_frozen_kv_metadata(self, forward_batch) -> None:
        with self._frozen_kv_target_view(forward_batch):
            self.draft_attn_backend.init_forward_metadata(forward_batch)
        forward_batch.mark_forward_metadata_ready()
"""
_SCHED_V2_BRANCH = """\
            elif {cond}:
                # {label}: drive the V2 worker synchronously (no
                # future_map relay / on_publish).
                resolve_forward_inputs(batch, self.future_map)
                with self._forward_isolation(batch, overlap=False):
                    batch_result = self.model_worker.forward_batch_generation(batch)
                # The isolation restore reverted the worker's in-forward SB edits;
                # re-apply what must carry to the next iter.
                batch.spec_info = batch_result.next_draft_input
                if batch_result.new_seq_lens is not None:
                    batch.seq_lens = batch_result.new_seq_lens
"""
_SCHED_23 = """\
class Scheduler:
    def run_batch(self, batch):
        if True:
            if True:
                if True:
                    new_seq_lens = batch_result.new_seq_lens
                    if new_seq_lens is not None and new_seq_lens is not batch.seq_lens:
                        batch.seq_lens = new_seq_lens
"""
_S = "sglang/srt/"
# 0.5.17's and 0.5.23's BatchResultProcessor._append_decode_hidden_states (installed text, its else branch)
_BRP_HIDDEN = (
    "class BatchResultProcessor:\n"
    "    @staticmethod\n"
    "    def _append_decode_hidden_states(*, req, hidden_states, start, accept_len):\n"
    '        if req.return_hidden_states == "last":\n'
    "            pass\n"
    "        else:\n"
    "            req.hidden_states.extend(\n"
    "                hidden_states[start : start + accept_len].cpu().tolist()\n"
    "            )\n"
)
FORMS = {
    "0.5.13": {
        _S + "managers/schedule_batch.py": _SB,
        _S + "layers/utils/logprob.py": _LP13,
        _S + "speculative/eagle_info.py": _V1,
        _S + "speculative/eagle_info_v2.py": _V1.replace("if sampling_info.logit_bias", "if x"),
        _S + "speculative/frozen_kv_mtp_worker.py": _W,
        # 0.5.13's non-overlap V2 branch: a path its Frozen-KV MTP (v1 worker) never takes
        _S + "managers/scheduler.py": "class Scheduler:\n    def run_batch(self, batch):\n            if a:\n"
        "                pass\n" + _SCHED_V2_BRANCH.format(cond="batch.is_spec_v2", label="Non-overlap V2"),
    },
    "0.5.17": {
        _S + "managers/scheduler_components/batch_result_processor.py": _BRP_HIDDEN,
        _S + "managers/schedule_batch.py": _SB,
        _S + "layers/logprob_processor.py": _LP17,
        _S + "speculative/eagle_utils.py": _V2.replace("TAIL", _V2_TAIL_17),
        _S + "speculative/frozen_kv_mtp_worker_v2.py": _W,
        _S + "managers/scheduler.py": "class Scheduler:\n    def run_batch(self, batch):\n            if a:\n"
        "                pass\n"
        + _SCHED_V2_BRANCH.format(cond="not batch.spec_algorithm.is_none()", label="Non-overlap"),
    },
    "0.5.23": {
        _S + "managers/scheduler_components/batch_result_processor.py": _BRP_HIDDEN,
        _S + "managers/schedule_batch.py": _SB,
        _S + "layers/logprob_processor.py": _LP23,
        _S + "speculative/eagle_utils.py": _V2.replace("TAIL", _V2_TAIL_23),
        _S + "speculative/frozen_kv_mtp_worker_v2.py": _W,
        _S + "managers/scheduler.py": _SCHED_23,
    },
}


def _tree(root: Path, files: dict[str, str], release: str | None = None) -> Path:
    if release is not None:  # what sglang_version reads, as an installed release carries it
        files = {**files, "sglang/_version.py": f"__version__ = version = '{release}'\n"}
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "sglang"


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("mutant_id", list(SURFACE))
def test_surface_mutants_apply_where_intended(tmp_path, release, mutant_id):
    mutant = C.catalogue_by_id()[mutant_id]
    app = F.apply(mutant, _tree(tmp_path, FORMS[release], release))
    want = SURFACE[mutant_id][1 + RELEASES.index(release)]
    assert not any(s.status.startswith("anchor found") for s in app.sites)  # never ambiguous
    if want is None:
        assert not app.applicable and release in mutant.na_on, app.reason()
        # said by design, with the reason, before any anchor is looked at: nothing is patched
        assert app.reason() == f"n.a. by design on sglang {release}: {mutant.na_why}" and not app.modules
        assert mutant.na_why
        return
    assert app.applicable and app.error is None, app.reason()
    assert {Path(f).name for f in app.files} == want
    assert release not in C.catalogue_by_id()[mutant_id].na_on


def _patched(tmp_path: Path, mutant_id: str, release: str, file: str) -> str:
    app = F.apply(C.catalogue_by_id()[mutant_id], _tree(tmp_path / release, FORMS[release]))
    return next(m["patched"] for m in app.modules.values() if m["rel"].endswith(file))


def test_surface_edits_do_what_they_model(tmp_path):
    for r in RELEASES:
        v1 = r == "0.5.13"
        verify = "eagle_info.py" if v1 else "eagle_utils.py"
        text = _patched(tmp_path, "verify-logit-bias-dropped", r, verify)
        assert "next_token_logits.add(\n" in text and "next_token_logits.add_(" not in text
        text = _patched(tmp_path, "verify-temperature-row0", r, verify)
        assert text.count("sampling_info.temperatures[:1].expand_as(sampling_info.temperatures)") == 1
        text = _patched(tmp_path, "sampled-bonus-greedy", r, verify)
        assert text.count("predict[_last] = target_probs") == 1
        assert (
            text.index("deterministic=True")
            < text.index("_full = ")
            < text.index("# Sync sampling" if r != "0.5.23" else "del (")
        )  # after the sampling kernel, before the TP sync
        if not v1:
            text = _patched(tmp_path, "eager-draft-kv-short", r, "frozen_kv_mtp_worker_v2.py")
            assert "forward_batch.seq_lens - 1\n            self.draft_attn_backend.init_forward_metadata(" in text
            assert (
                "            forward_batch.seq_lens = _lens\n        forward_batch.mark_forward_metadata_ready" in text
            )
        text = _patched(tmp_path, "logprob-row-shift", r, "logprob.py" if v1 else "logprob_processor.py")
        assert (
            "(torch.arange(len(batch_next_token_ids), device=batch.sampling_info.device) - 1).clamp(min=0)"
            if v1
            else "next_token_logits[flat_accept_idx - 1]"
        ) in text
        text = _patched(tmp_path, "greedy-row-top2-in-mixed-verify", r, verify)
        assert text.count("sampling_info.top_ks.clamp(min=2), ") == 1 and "sampling_info.top_ks, " not in text
    for r in ("0.5.17", "0.5.23"):
        text = _patched(tmp_path, "seeded-verify-coins-unseeded", r, "eagle_utils.py")
        assert "    if False:  # the seeded coins never drawn\n        return _seeded_verify_coins(\n" in text
        assert "sampling_seed is not None" not in text and "coins = torch.rand_like(" in text  # the unseeded path
        text = _patched(tmp_path, "no-overlap-seq-lens-dropped", r, "scheduler.py")
        assert "new_seq_lens is None" in text and "new_seq_lens is not None" not in text


class _Params:
    ignore_eos = False
    stop_token_ids = {7}


def _finish(mutant: bool, output_ids: list[int], new: int) -> int | None:
    """Run the installed form of Req._check_token_based_finish (intact or mutated) on a fake request whose last
    ``new`` output tokens are one verify step's accepted run; its finished_len."""
    text = _SB
    if mutant:
        site = C.catalogue_by_id()["stop-match-at-step-end"].sites[0]
        text = text.replace(site.anchor, site.replacement)
    ns: dict = {}
    exec(compile(text, "schedule_batch", "exec"), ns)
    req = ns["Req"]()
    req.sampling_params, req.eos_token_ids, req.output_ids, req.finished_len = _Params(), {1, 12}, output_ids, None
    assert req._check_token_based_finish(output_ids[-new:])
    return req.finished_len


def test_stop_mutant_keeps_the_tokens_after_a_stop_inside_the_run():
    out = [3, 4, 5, 6, 7, 8, 9]  # prefill token 3, then one verify step of 6 accepted tokens; stop token 7
    assert _finish(False, out, 6) == 5  # intact: the output ends at the stop
    assert _finish(True, out, 6) == 7  # mutant: 8 and 9 stay
    assert _finish(False, out[:5], 1) == _finish(True, out[:5], 1) == 5  # one token per step (no MTP): the same
    out = [2, 3, 4, 5, 6, 7]  # the stop as the bonus token (the run's last): the same either way
    assert _finish(False, out, 5) == _finish(True, out, 5) == 6


def _torch_python() -> str | None:
    """A Python with torch: an sglang row venv's ($MTPMATRIX_SGLANG_DIRS package folders, else this checkout's
    .nox), for running the bonus mutant's inserted line on CPU tensors."""
    dirs = [d for d in os.environ.get("MTPMATRIX_SGLANG_DIRS", "").split(os.pathsep) if d]
    dirs += [str(p) for p in sorted(REPO.glob(".nox/*sglang-0?5?*/lib/python3*/site-packages/sglang"))]
    for d in dirs:
        py = Path(d).parents[3] / "bin" / "python"
        if py.exists():
            return str(py)
    return None


def test_greedy_bonus_line_rewrites_only_the_bonus_of_fully_accepted_rows():
    py = _torch_python()
    if py is None:
        pytest.skip("no Python with torch here (MTPMATRIX_SGLANG_DIRS, or a row venv under .nox)")
    line = request_surface._GREEDY_BONUS
    script = (
        textwrap.dedent("""\
        import torch
        bs, D, V = 2, 3, 5  # 2 requests, chain of 2 drafts + root, 5 tokens
        target_probs = torch.tensor([[[.1, .2, .3, .4, 0.]] * D] * bs)  # argmax 3 everywhere
        predict = torch.tensor([1, 2, 0, 4, 0, 0], dtype=torch.int32)  # row 0: all accepted, bonus 0 at node 2
        accept_index = torch.tensor([[0, 1, 2], [3, -1, -1]], dtype=torch.int32)  # row 1: first draft rejected
        num_correct_drafts = torch.tensor([2, 0], dtype=torch.int32)
        """)
        + line
        + "print(predict.tolist())\n"
    )
    out = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[1, 2, 3, 4, 0, 0]"  # row 0's bonus -> argmax 3; row 1's residual kept
