"""The tiny-pair templates keep the structure the Gemma 4 MTP path relies on (no transformers needed)."""

from __future__ import annotations

import pytest

from mtpmatrix.pairs.tiny import build, configs
from mtpmatrix.pairs.tiny.vocab import MM_TOKEN_IDS


@pytest.mark.parametrize("name", build.PAIR_NAMES)
@pytest.mark.parametrize("constructed", [False, True])
def test_assistant_template_satisfies_validate_architecture(name, constructed):
    a = configs.assistant_template(name, constructed)
    t = configs.target_template(name, constructed)
    at, tt = a["text_config"], t["text_config"]
    assert a["model_type"] == "gemma4_assistant" and a["architectures"] == ["Gemma4AssistantForCausalLM"]
    assert t["model_type"] == "gemma4" and t["architectures"] == ["Gemma4ForConditionalGeneration"]
    # Gemma4AssistantConfig.validate_architecture
    assert at["hidden_size_per_layer_input"] == 0 and at["vocab_size_per_layer_input"] == 0
    assert at["enable_moe_block"] is False and at["use_double_wide_mlp"] is False
    assert at["num_kv_shared_layers"] == at["num_hidden_layers"] == len(at["layer_types"])
    # the assistant reads the target's last sliding + last full KV: same shapes
    for k in (
        "head_dim",
        "global_head_dim",
        "num_key_value_heads",
        "num_global_key_value_heads",
        "attention_k_eq_v",
        "sliding_window",
        "vocab_size",
    ):
        assert at[k] == tt[k], k
    assert set(at["layer_types"]) == set(tt["layer_types"]) == {"sliding_attention", "full_attention"}
    assert tt["layer_types"][-1] == at["layer_types"][-1] == "full_attention"
    assert a["backbone_hidden_size"] == tt["hidden_size"] > at["hidden_size"]
    assert at["num_attention_heads"] % at["num_key_value_heads"] == 0
    if a["use_ordered_embeddings"]:
        assert at["vocab_size"] % a["num_centroids"] == 0
        assert a["centroid_intermediate_top_k"] < a["num_centroids"]
    assert tt["tie_word_embeddings"] is (not constructed) and t["tie_word_embeddings"] is (not constructed)
    assert all(v < tt["vocab_size"] for v in MM_TOKEN_IDS.values())


def test_families_keep_their_structure():
    e = configs.target_template("e-series")["text_config"]
    assert e["hidden_size_per_layer_input"] > 0 and e["vocab_size_per_layer_input"] == e["vocab_size"]
    assert 0 < e["num_kv_shared_layers"] < e["num_hidden_layers"] and e["global_head_dim"] != e["head_dim"]
    assert configs.assistant_template("e-series")["use_ordered_embeddings"] is True
    assert configs.target_template("e-series")["audio_config"] is not None
    moe = configs.target_template("moe-26b-a4b")["text_config"]
    assert moe["enable_moe_block"] and moe["num_experts"] > moe["top_k_experts"] > 0 and moe["moe_intermediate_size"]
    dense = configs.target_template("dense-31b")["text_config"]
    assert not dense["enable_moe_block"] and dense["hidden_size_per_layer_input"] == 0


def test_pair_hash_is_stable_and_distinct():
    hashes = {(n, c): build.pair_hash(n, c, 0) for n in build.PAIR_NAMES for c in configs.VARIANTS}
    assert len(set(hashes.values())) == len(hashes)  # the two witness phases are different pairs
    assert build.pair_hash("e-series", True, 0) == hashes[("e-series", "constructed")]
    assert build.pair_hash("dense-31b", False, 0) == hashes[("dense-31b", "random")]
    assert build.pair_hash("dense-31b", False, 1) != hashes[("dense-31b", "random")]


def test_build_pair_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny pair"):
        build.build_pair("gemma-5", tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", build.PAIR_NAMES)
def test_witness_layout_fits_every_family(name):
    from mtpmatrix.pairs.witness.layout import Layout, physical_kv_layers

    t, a = configs.target_template(name, "witness"), configs.assistant_template(name, "witness")
    assert t["text_config"]["tie_word_embeddings"] is False  # the witness target has its own output head
    centroids = a["num_centroids"] if a["use_ordered_embeddings"] else 0
    Layout(t["text_config"]["hidden_size"], a["text_config"]["hidden_size"], centroids).check()
    phys = physical_kv_layers(t["text_config"])
    # binding the wrong layer of a type must be possible to ablate: two physical layers of each type
    assert all(len(phys[k]) >= 2 for k in ("sliding_attention", "full_attention")), phys


def test_variant_names():
    assert configs.variant_name(True) == "constructed" and configs.variant_name(False) == "random"
    assert configs.variant_name("witness") == "witness"
    with pytest.raises(ValueError, match="unknown tiny pair variant 'nope'"):
        configs.variant_name("nope")


def test_sglang_draft_phase_follows_the_release():
    from mtpmatrix.pairs.witness import phase

    assert phase.sglang_draft_phase("0.5.13") == phase.sglang_draft_phase("0.5.23") == -1  # measured / same code
    assert phase.sglang_draft_phase("0.5.24") == phase.REFERENCE_DRAFT_PHASE  # unmeasured: expected fixed
    assert phase.phase_of_variant("witness") == phase.REFERENCE_DRAFT_PHASE == 1
    assert phase.phase_of_variant("decoy") == phase.REFERENCE_DRAFT_PHASE
    assert phase.phase_of_variant("decoy-sglang-phase") == phase.phase_of_variant("witness-sglang-phase")


def test_decoy_variants_hash_their_own_construction():
    """A decoy pair is rebuilt when decoy.py changes; a plain witness pair only when the witness construction does."""
    assert {"decoy", "decoy-sglang-phase"} <= set(configs.VARIANTS)
    assert build.pair_hash("dense-31b", "decoy", 0) != build.pair_hash("dense-31b", "witness", 0)


def test_the_spherical_code_is_computed_once_per_generator_state():
    """witness.codes.spherical_code keeps its result by generator state (issue #21): the same state gives the same code
    without the repulsion run again, and the generator always advances exactly as one draw moves it. Needs torch
    (run it with a row's venv: PYTHONPATH=src .nox/<row>/bin/python -m pytest tests/unit/test_tiny.py -k spherical)."""
    torch = pytest.importorskip("torch")
    from mtpmatrix.pairs.witness import codes

    codes._CODES.clear()
    runs = []
    real = codes._repel
    codes._repel = lambda x, steps: runs.append(steps) or real(x, steps)
    try:
        first_gen, again_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        first = codes.spherical_code(16, 8, first_gen, steps=20)
        again = codes.spherical_code(16, 8, again_gen, steps=20)
        other = codes.spherical_code(16, 8, torch.Generator().manual_seed(8), steps=20)
    finally:
        codes._repel = real
    assert runs == [20, 20]  # seed 7 once, seed 8 once
    assert torch.equal(first, again) and not torch.equal(first, other)
    again.zero_()  # a caller's copy: the kept code is untouched
    assert torch.equal(codes.spherical_code(16, 8, torch.Generator().manual_seed(7), steps=20), first)
    fresh = torch.Generator().manual_seed(7)
    torch.randn(16, 8, generator=fresh, dtype=torch.float64)
    assert torch.equal(again_gen.get_state(), fresh.get_state())
