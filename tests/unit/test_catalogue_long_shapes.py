"""The catalogue's mutants for issue #38's new paths (request shapes in faults/catalogue/request_surface.py, the
long-and-tight family in faults/catalogue/long_context.py): where each applies on each release's form of the lines
it edits (verbatim excerpts of the installed sources), n.a. by design where it says so, the servers it launches,
and what the edits do where that can be run without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.faults import catalogue as C
from mtpmatrix.faults import mutation as F
from mtpmatrix.faults.catalogue import long_context as LC
from mtpmatrix.faults.catalogue import servers as CS

RELEASES = ("0.5.13", "0.5.17", "0.5.23")
NEW = {  # mutant -> (category, files patched on 0.5.13, on 0.5.17, on 0.5.23); None: n.a. by design
    "grammar-verify-unmasked": ("grammar", None, {"eagle_utils.py"}, {"eagle_utils.py"}),
    "stop-regex-at-step-end": ("stop-regex", None, {"schedule_batch.py"}, {"schedule_batch.py"}),
    "ids-logprob-node-early": ("ids-logprob", {"logprob.py"}, {"logprob_processor.py"}, {"logprob_processor.py"}),
    "stream-run-last-token-only": ("streaming", *[{"output_streamer.py"}] * 3),
    "swa-verify-window-short": ("swa-verify", *[{"triton_backend.py"}] * 3),
    "spec-overalloc-tail-kept": ("kv-release", None, {"common.py"}, {"common.py"}),
    "spec-context-reserve-dropped": ("context-limit", *[{"tokenizer_manager.py"}] * 3),
    "frozen-kv-view-drops-cached": (
        "draft-view",
        {"frozen_kv_mtp_worker.py"},
        {"frozen_kv_mtp_worker_v2.py"},
        {"frozen_kv_mtp_worker_v2.py"},
    ),
}
SHAPES = list(NEW)[:4]
LONG = list(NEW)[4:]

_S = "sglang/srt/"
_GRAMMAR = "    if grammar_mask is not None:\n        grammar_mask.apply(next_token_logits)\n"
_REGEX_17 = (
    "                    if matched:\n"
    "                        self.finished_reason = FINISHED_MATCHED_REGEX(\n"
    "                            matched=stop_regex_str\n"
    "                        )\n"
    "                        self.finished_len = self._locate_str_stop_finished_len(\n"
    "                            new_accepted_len, stop_regex=stop_regex_str\n"
    "                        )\n"
)
_REGEX_23 = (
    "                    if finished_len is not None:\n"
    "                        self.finished_reason = FINISHED_MATCHED_REGEX(\n"
    "                            matched=stop_regex_str\n"
    "                        )\n"
    "                        self.finished_len = finished_len\n"
    "                        return True\n"
)
_IDS_V2 = "        ) = get_token_ids_logprobs(\n            gathered_logprobs, token_ids_logprobs_expanded, no_copy_to_cpu=True\n"
_IDS_13 = (
    "        ) = get_token_ids_logprobs(\n            logprobs,\n            token_ids_logprobs_repeat_interleaved,\n"
)
_STREAM = (
    "        output_ids_ = req.output_ids_through_stop\n"
    "        self.output_ids.append(output_ids_[send_token_offset:])\n"
    "        req.send_token_offset = len(output_ids_)\n"
)
_RELEASE_TAIL = (
    "    if page_size > 1:\n        start_p = ceil_align(start_p, page_size)\n\n    if start_p < end_p:\n        FREE\n"
)
_RESERVE = "        input_token_num += self.num_reserved_tokens\n"


def _class(body: str) -> str:
    """``body`` (lines as indented in the installed file) inside a method, nested as deep as its indentation."""
    indent = len(body) - len(body.lstrip(" "))
    return "class X:\n    def f(self):\n" + "".join(" " * k + "if True:\n" for k in range(8, indent, 4)) + body


def _call(excerpt: str) -> str:
    """An excerpt that starts inside a tuple assignment's closing line, made a whole statement."""
    return "def g():\n    if True:\n        (\n            val,\n            idx,\n" + excerpt + "        )\n"


FORMS = {
    "0.5.13": {
        _S + "layers/utils/logprob.py": _call(_IDS_13),
        _S + "managers/scheduler_components/output_streamer.py": _class(_STREAM),
        _S + "layers/attention/triton_backend.py": "x = (\n" + LC._SWA_GRAPH + LC._SWA_EAGER + ")\n",
        _S + "managers/tokenizer_manager.py": _class(_RESERVE),
        _S + "speculative/frozen_kv_mtp_worker.py": _class(LC._DRAFT_VIEW),
    },
    "0.5.17": {
        _S + "speculative/eagle_utils.py": "def eagle_sample(grammar_mask, next_token_logits):\n" + _GRAMMAR,
        _S + "managers/schedule_batch.py": _class(_REGEX_17),
        _S + "layers/logprob_processor.py": _call(_IDS_V2),
        _S + "managers/scheduler_components/output_streamer.py": _class(_STREAM),
        _S + "layers/attention/triton_backend.py": "x = (\n" + LC._SWA_GRAPH + LC._SWA_EAGER + ")\n",
        _S + "mem_cache/common.py": "def r(start_p, end_p, spec_algo, page_size):\n"
        + _RELEASE_TAIL.replace("FREE", "allocator.free_segment(indices_to_free, start_pos=start_p)"),
        _S + "managers/tokenizer_manager.py": _class(_RESERVE),
        _S + "speculative/frozen_kv_mtp_worker_v2.py": _class(LC._DRAFT_VIEW),
    },
    "0.5.23": {
        _S + "speculative/eagle_utils.py": "def eagle_sample(grammar_mask, next_token_logits):\n" + _GRAMMAR,
        _S + "managers/schedule_batch.py": _class(_REGEX_23),
        _S + "layers/logprob_processor.py": _call(_IDS_V2),
        _S + "managers/scheduler_components/output_streamer.py": _class(_STREAM),
        _S + "layers/attention/triton_backend.py": "x = (\n" + LC._SWA_GRAPH + LC._SWA_EAGER_23 + ")\n",
        _S + "mem_cache/common.py": "def r(start_p, end_p, spec_algo, page_size):\n"
        + _RELEASE_TAIL.replace("FREE", "tree_cache.free_kv_row(req.kv, [(start_p, end_p)])"),
        _S + "managers/tokenizer_manager.py": _class(_RESERVE),
        _S + "speculative/frozen_kv_mtp_worker_v2.py": _class(LC._DRAFT_VIEW),
    },
}


def _pkg(root: Path, release: str) -> Path:
    """The release's forms as an installed tree (text as is: the anchors' indentation is the point)."""
    for rel, text in {**FORMS[release], "sglang/_version.py": f"__version__ = version = '{release}'\n"}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "sglang"


def test_the_new_mutants_follow_the_earlier_ones_in_order():
    ids = [m.id for m in C.CATALOGUE]
    assert ids[-len(NEW) :] == list(NEW)
    assert ids[-len(NEW) - 2 : -len(NEW)] == ["hidden-states-next-node", "hidden-states-prefill-offset-asking-only"]
    assert len(ids) == 38  # docs/fault-injection.md states this count


# verbatim: batch_result_processor.py _append_prefill_hidden_states, 0.5.17 l. 506-510 (0.5.23 l. 651-655 alike), and
# 0.5.13's l. 466-479, which advances the offset only where it is called (for a request that asks)
_PREFILL_HS_17 = (
    "        if capture_hidden_mode.is_full():\n"
    "            start = hidden_state_offset\n"
    "            hidden_state_offset += extend_input_len\n"
    "            if not store or not req.return_hidden_states:\n"
    "                return hidden_state_offset\n"
)
_PREFILL_HS_13 = (
    "        req.hidden_states.append(\n"
    "            logits_output.hidden_states[\n"
    "                hidden_state_offset : (\n"
    "                    hidden_state_offset := hidden_state_offset\n"
    "                    + len(req.origin_input_ids)\n"
)


@pytest.mark.parametrize("release", RELEASES)
def test_the_prefill_offset_mutant_skips_plain_requests_where_sglang_advances_past_them(tmp_path, release):
    """0.5.17 and 0.5.23 advance the offset past every request; the mutant takes a plain request's rows back off it
    (0.5.13's behaviour). On 0.5.13 the call already sits under req.return_hidden_states: n.a. by design."""
    mutant = C.catalogue_by_id()["hidden-states-prefill-offset-asking-only"]
    root = tmp_path / release
    module = root / "sglang/srt/managers/scheduler_components/batch_result_processor.py"
    module.parent.mkdir(parents=True)
    module.write_text(_class(_PREFILL_HS_13 if release == "0.5.13" else _PREFILL_HS_17))
    (root / "sglang/_version.py").write_text(f"__version__ = version = '{release}'\n")
    app = F.apply(mutant, root / "sglang")
    if release == "0.5.13":
        assert app.reason() == f"n.a. by design on sglang {release}: {mutant.na_why}" and not app.modules
        return
    assert app.applicable and app.error is None, app.reason()
    (patched,) = (m["patched"] for m in app.modules.values())
    assert "                return hidden_state_offset - extend_input_len  #" in patched
    compile(patched, str(module), "exec")


def test_every_new_mutant_is_complete_and_launches_the_servers_its_check_compares():
    by_id = C.catalogue_by_id()
    known = {s.name for s in smoke_servers.SMOKE_SERVERS}
    for mid, (category, *files) in NEW.items():
        m = by_id[mid]
        assert m.category == category and category in F.CATEGORIES and len(category) <= 15, mid
        assert m.sites and m.models and m.expect and set(m.servers) <= known, mid
        assert bool(m.na_on) == bool(m.na_why) and set(m.na_on) == {r for r, f in zip(RELEASES, files) if f is None}
    for mid in SHAPES:  # MTP equals no-MTP: the no-MTP witness in the same suite
        assert by_id[mid].servers == ("witness-mtp-topk1", "witness-mtp-topk3", "witness-nomtp"), mid
    for mid in LONG:  # the twin passes where the MTP servers fail: one suite shows both
        assert by_id[mid].servers == CS.LONG == smoke_servers.LONG_SERVERS, mid
    # every check an expect names exists in the smoke tier
    tiers = Path(__file__).resolve().parents[1] / "tiers"
    defined = {line.split("(")[0][4:] for p in tiers.glob("test_smoke*.py") for line in p.read_text().splitlines()}
    for mid in NEW:
        named = {w.split("[")[0].rstrip(",:;)") for w in by_id[mid].expect.split() if w.startswith("test_")}
        assert named and named <= defined, (mid, named - defined)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("mutant_id", list(NEW))
def test_new_mutants_apply_where_intended(tmp_path, release, mutant_id):
    mutant = C.catalogue_by_id()[mutant_id]
    app = F.apply(mutant, _pkg(tmp_path, release))
    want = NEW[mutant_id][1 + RELEASES.index(release)]
    assert not any(s.status.startswith("anchor found") for s in app.sites)  # never ambiguous
    if want is None:
        assert app.reason() == f"n.a. by design on sglang {release}: {mutant.na_why}" and not app.modules
        return
    assert app.applicable and app.error is None, app.reason()
    assert {Path(f).name for f in app.files} == want


def _patched(tmp_path: Path, mutant_id: str, release: str) -> str:
    app = F.apply(C.catalogue_by_id()[mutant_id], _pkg(tmp_path / release, release))
    (module,) = app.modules.values()
    return module["patched"]


def test_the_window_mutant_moves_both_target_verify_buffers_and_nothing_else(tmp_path):
    for r in RELEASES:
        text = _patched(tmp_path, "swa-verify-window-short", r)
        assert text.count("self.sliding_window_size - 1,") == 2 and text.count("self.sliding_window_size,") == 0


def _visible(seq_len: int, buffer: int, layer_window: int, drafts: int) -> list[set[int]]:
    """Which prefix positions each verify node attends to on a sliding layer, as the Triton backend builds it:
    update_sliding_window_buffer keeps the last min(seq_len, buffer) slots (first slot seq_len - that), and the
    extend kernel's stage-1 mask lets node m see window slot n when prefix_len + m <= n + layer_window
    (kernels/ops/attention/extend_attention.py, 0.5.17)."""
    lens = min(seq_len, buffer)
    start = seq_len - lens
    return [{start + n for n in range(lens) if lens + m <= n + layer_window} for m in range(drafts)]


def test_the_shortened_window_hides_only_the_roots_far_edge():
    size, seq, drafts = 63, 160, 6  # layer.sliding_window_size = config.sliding_window - 1 (gemma4_causal.py)
    intact, short = _visible(seq, size, size, drafts), _visible(seq, size - 1, size, drafts)
    assert min(intact[0]) == seq - 63  # the root (position seq) reads its edge, 63 back: the long witness's read
    assert short[0] == intact[0] - {seq - 63}  # the mutant: the edge gone, nothing else
    assert short[1:] == intact[1:]  # nodes 1..5 see exactly what they did
    # the custom mask's row (offset + prefix + drafts wide) stays seq_len + drafts: no misread mask, no crash
    assert all(seq - min(seq, b) + min(seq, b) + drafts == seq + drafts for b in (size, size - 1))
    assert _visible(40, size - 1, size, drafts) == _visible(40, size, size, drafts)  # inside the window: identity


def _release(text: str) -> list[tuple[int, int]]:
    """Run the excerpt of _release_overallocated_kv_indices (its free call recorded instead) for a request under
    MTP (committed 100, allocated 124, 16-token pages) and one without (nothing over-allocated); what it frees."""
    freed: list[tuple[int, int]] = []
    for call in (
        "allocator.free_segment(indices_to_free, start_pos=start_p)",
        "tree_cache.free_kv_row(req.kv, [(start_p, end_p)])",
    ):
        text = text.replace(call, "freed.append((start_p, end_p))")
    ns = {"ceil_align": lambda x, p: -(-x // p) * p, "freed": freed}
    exec(compile(text, "common", "exec"), ns)
    ns["r"](100, 124, "FROZEN_KV_MTP", 16)
    ns["r"](100, 100, None, 1)
    return freed


def test_the_release_mutant_keeps_the_over_allocated_tail_only_under_mtp(tmp_path):
    for r in ("0.5.17", "0.5.23"):
        intact = FORMS[r][_S + "mem_cache/common.py"]
        assert _release(intact) == [(112, 124)]  # the page-aligned tail past the committed KV goes back
        assert _release(_patched(tmp_path, "spec-overalloc-tail-kept", r)) == []  # the mutant: it stays allocated


def test_the_reserve_mutant_admits_as_if_nothing_were_reserved(tmp_path):
    for r in RELEASES:
        text = _patched(tmp_path, "spec-context-reserve-dropped", r)
        assert "input_token_num += 0 * self.num_reserved_tokens\n" in text


def test_the_shape_edits(tmp_path):
    for r in ("0.5.17", "0.5.23"):
        assert "if grammar_mask is not None and False:" in _patched(tmp_path, "grammar-verify-unmasked", r)
        text = _patched(tmp_path, "stop-regex-at-step-end", r)
        assert "self.finished_len = len(self.output_ids)\n" in text and "new_accepted_len, stop_regex" not in text
        assert "gathered_logprobs.roll(1, dims=0), token_ids" in _patched(tmp_path, "ids-logprob-node-early", r)
    assert "logprobs.roll(1, dims=0),\n" in _patched(tmp_path, "ids-logprob-node-early", "0.5.13")
    for r in RELEASES:
        text = _patched(tmp_path, "stream-run-last-token-only", r)
        assert "output_ids_[len(output_ids_) - 1 :] if req.stream else output_ids_[send_token_offset:]" in text


def test_the_view_mutant_takes_the_cached_prefix_off_the_drafts_view_only(tmp_path):
    for r in RELEASES:
        text = _patched(tmp_path, "frozen-kv-view-drops-cached", r)
        # the draft's forward batch (seq_lens, its CPU copy and sum) loses each request's cached prefix before its
        # positions are set from it; the decode batch's seq_lens (verify's) are not touched
        assert "[r.cached_tokens for r in batch.reqs]" in text and " batch.seq_lens =" not in text
        edit = text.index("forward_batch.seq_lens = forward_batch.seq_lens - _cached")
        assert edit < text.index("self._set_positions(forward_batch)") and text.count("_set_positions") == 1
        assert "forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu - _cached" in text
