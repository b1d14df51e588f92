"""The tiny pairs' config.json templates: three families, each a scaled-down copy of a real checkpoint family's
*structure*, and what each variant changes in them.

  e-series       E2B/E4B-like: per-layer inputs (PLE: hidden_size_per_layer_input, vocab_size_per_layer_input),
                 sliding + full attention layers with different head dims (head_dim vs global_head_dim),
                 KV sharing (num_kv_shared_layers) and double-wide MLPs in the shared layers, vision + audio towers;
                 assistant with use_ordered_embeddings=True (centroid head, vocab a multiple of num_centroids).
  moe-26b-a4b    26B-A4B-like: MoE block (enable_moe_block, num_experts, top_k_experts, moe_intermediate_size)
                 next to the dense MLP, attention_k_eq_v + num_global_key_value_heads on full layers, vision tower.
  dense-31b      31B-like: dense target, attention_k_eq_v + num_global_key_value_heads, vision tower.

Target form: ``model_type "gemma4"`` / ``Gemma4ForConditionalGeneration`` with tiny vision (and, for e-series,
audio) configs, i.e. the form of the real google/gemma-4-* checkpoints. That is the form sglang's Gemma 4 path
remaps ``swa_*`` attributes for, so no ``swa_*`` keys are written; in exchange the target folder carries a
processor (Gemma4Processor: image processor, audio feature extractor, video processor, chat template) and the
tokenizer, which sglang needs even with --skip-tokenizer-init. The assistant is ``model_type "gemma4_assistant"``
/ ``Gemma4AssistantForCausalLM`` with a ``text_config`` whose every layer is KV-shared (it reads the target's last
sliding and last full layer KV), whose head dims / KV heads / k_eq_v equal the target's, and with
``backbone_hidden_size`` = the target's hidden size (the assistant's own hidden size is smaller, as in the real
ones).

config.json files are written from the plain-dict templates below, never serialized from transformers config
classes: a transformers without a Gemma 4 class still gets the same files, and failing to load them is the
signal. ``"dtype": "bfloat16"`` in both configs (both sglang and transformers load bf16, and the reference tier
upcasts to fp32 on CPU).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mtpmatrix.pairs.long_witness import CONTEXT_LEN
from mtpmatrix.pairs.tiny.vocab import BOS_ID, END_OF_TURN_ID, EOS_ID, MM_TOKEN_IDS, PAD_ID, VOCAB

DTYPE = "bfloat16"
TARGET_HIDDEN = 128
ASSISTANT_HIDDEN = 64
SLIDING_WINDOW = 64  # small, so sglang prompts > 64 tokens exercise SWA; transformers cannot crop a sliding cache
# that has seen more than the window (assisted decoding rejects drafts by cropping), so reference prompts stay inside it


_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def text_config(**over) -> dict:
    """A text_config template: what every family and the assistants start from, with ``over`` changed."""
    base = {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB,
        "hidden_size": TARGET_HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_global_key_value_heads": None,
        "attention_k_eq_v": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "tie_word_embeddings": True,
        "rope_parameters": copy.deepcopy(_ROPE),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        "use_bidirectional_attention": None,
        "vocab_size_per_layer_input": 0,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "use_double_wide_mlp": False,
        "num_experts": None,
        "top_k_experts": None,
        "moe_intermediate_size": None,
        "dtype": DTYPE,
    }
    base.update(over)
    return base


_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "position_embedding_size": 1024,
    "use_clipped_linears": False,
    "standardize": False,
    "initializer_range": 0.02,
    "dtype": DTYPE,
}
_AUDIO = {
    "model_type": "gemma4_audio",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "hidden_act": "silu",
    "subsampling_conv_channels": [8, 4],
    "conv_kernel_size": 5,
    "residual_weight": 0.5,
    "attention_chunk_size": 12,
    "attention_context_left": 13,
    "attention_context_right": 0,
    "attention_logit_cap": 50.0,
    "attention_invalid_logits_value": -1.0e9,
    "use_clipped_linears": True,
    "rms_norm_eps": 1e-6,
    "gradient_clipping": 1e10,
    "output_proj_dims": 64,
    "initializer_range": 0.02,
    "dtype": DTYPE,
}

_S, _F = "sliding_attention", "full_attention"
# Two physical (non-KV-shared) layers of each attention type, so that binding the assistant to the wrong one of a
# type is a different layer, as in the real checkpoints (5 sliding : 1 full, many layers).
_DENSE_LAYERS = [_S, _S, _F, _S, _S, _F]
_E_LAYERS = _DENSE_LAYERS + [_S, _F]  # the last two are KV-shared (num_kv_shared_layers=2)

_TARGET_TEXT = {
    "e-series": text_config(
        num_hidden_layers=8,
        layer_types=_E_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
    ),
    "moe-26b-a4b": text_config(
        num_hidden_layers=6,
        layer_types=_DENSE_LAYERS,
        intermediate_size=128,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
    ),
    "dense-31b": text_config(
        num_hidden_layers=6, layer_types=_DENSE_LAYERS, num_global_key_value_heads=1, attention_k_eq_v=True
    ),
}

# Assistant-side knobs; everything attention-shaped is copied from the target text config.
_ASSISTANT = {
    "e-series": {"use_ordered_embeddings": True, "num_centroids": 16, "centroid_intermediate_top_k": 4},
    "moe-26b-a4b": {"use_ordered_embeddings": False, "num_centroids": 16, "centroid_intermediate_top_k": 4},
    "dense-31b": {"use_ordered_embeddings": False, "num_centroids": 16, "centroid_intermediate_top_k": 4},
}
_COPIED_FROM_TARGET = (
    "vocab_size",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "num_global_key_value_heads",
    "attention_k_eq_v",
    "sliding_window",
    "rope_parameters",
    "max_position_embeddings",
    "final_logit_softcapping",
    "hidden_activation",
    "rms_norm_eps",
)


# witness: built for transformers' draft phase; witness-sglang-phase: for sglang's (mtpmatrix.pairs.witness.phase)
# sampled: pairs/sampled/ring.py; decoy / decoy-sglang-phase: the witness with decoy drafts (mtpmatrix.pairs.decoy), at
# the same two phases as the witness
# long-witness / long-witness-sglang-phase: attention past the sliding window decides the next token
# (mtpmatrix.pairs.long_witness), the drafter at the same two phases as the witness
VARIANTS = (
    "random",
    "constructed",
    "witness",
    "witness-sglang-phase",
    "decoy",
    "decoy-sglang-phase",
    "sampled",
    "long-witness",
    "long-witness-sglang-phase",
)
# what a variant changes in both text configs: the long witness's requests run to its (short) context limit
_VARIANT_TEXT = {"long-witness": {"max_position_embeddings": CONTEXT_LEN}}


def _variant_text(variant: str) -> dict:
    return _VARIANT_TEXT.get(variant.removesuffix("-sglang-phase"), {})


def variant_name(variant: str | bool) -> str:
    """One of ``VARIANTS``; a bool means constructed (the older spelling)."""
    if isinstance(variant, bool):
        return "constructed" if variant else "random"
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny pair variant {variant!r}; known: {', '.join(VARIANTS)}")
    return variant


def target_template(name: str, variant: str | bool = "random") -> dict:
    text = copy.deepcopy(_TARGET_TEXT[name])
    text.update(_variant_text(variant_name(variant)))
    if variant_name(variant) != "random":
        text["tie_word_embeddings"] = False  # W[j] = E[j-1] needs an output head of its own
    cfg = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": copy.deepcopy(_VISION),
        "audio_config": copy.deepcopy(_AUDIO) if name == "e-series" else None,
        **MM_TOKEN_IDS,
        "initializer_range": 0.02,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "dtype": DTYPE,
    }
    return cfg


def assistant_template(name: str, variant: str | bool = "random") -> dict:
    tgt = _TARGET_TEXT[name]
    text = text_config(
        hidden_size=ASSISTANT_HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        num_kv_shared_layers=2,
        num_attention_heads=2 * tgt["num_key_value_heads"],
        **{k: copy.deepcopy(tgt[k]) for k in _COPIED_FROM_TARGET},
    )
    text.update(_variant_text(variant_name(variant)))
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "text_config": text,
        "backbone_hidden_size": tgt["hidden_size"],
        **_ASSISTANT[name],
        "tie_word_embeddings": True,
        "dtype": DTYPE,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, END_OF_TURN_ID], "pad_token_id": PAD_ID}


def config_kwargs(cfg: dict) -> dict:
    """A template as keyword arguments of transformers' config classes (without the keys they derive or reject)."""
    out = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "dtype", "eoa_token_id")}
    for sub in ("text_config", "vision_config", "audio_config"):
        if isinstance(out.get(sub), dict):
            out[sub] = {k: v for k, v in out[sub].items() if k not in ("model_type", "dtype")}
    return out


def write_json(path: Path, obj: dict) -> None:
    """A template (or generation config) as the JSON file transformers and sglang read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
