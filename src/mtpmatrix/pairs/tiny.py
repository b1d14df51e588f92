"""Tiny, shape-true Gemma 4 target + MTP assistant pairs, generated offline (no Hugging Face access needed).

Three families, each a scaled-down copy of a real checkpoint family's *structure*:

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

config.json files are written from the plain-dict TEMPLATES below, never serialized from transformers config
classes: a transformers without a Gemma 4 class still gets the same files, and failing to load them is the
signal. Weights are random (transformers' own init, seeded), saved as bf16 safetensors (``"dtype": "bfloat16"``
in both configs; both sglang and transformers load bf16, and the reference tier upcasts to fp32 on CPU).
When the model classes are missing the folder still gets configs + tokenizer and the marker says
``"weights": false`` with the reason.

In the MoE family every expert of a layer gets the same weights (the router still routes, and sglang's fused MoE
kernels still run). A random router scores its experts within a hair of each other, so bf16 rounding that differs
between a 12-token verify pass and a 1-token decode step flipped expert choices and moved the logits by up to 0.1
nats (2x H200, TP 2, sglang 0.5.17), beyond the smoke tier's near-tie bar; with shared experts the output does not
depend on which experts win, so MTP-vs-no-MTP divergences are bf16 near-ties again, as in the dense families.

constructed=True builds a pair whose weights make both models compute "next token = current token + 1 (mod vocab)":

  * every layer adds nothing to the residual stream: attention o_proj, MLP down_proj, MoE experts' down_proj and
    the PLE per_layer_projection are zero (target and assistant), so the final hidden state is norm(sqrt(H)*E[t]);
  * embedding rows E[t] live in the first ``A`` (= assistant hidden) dims: a unit random vector, plus, for the
    centroid head, a one-hot code of the centroid cluster that holds token t+1;
  * the target's output head is untied (``tie_word_embeddings: false``): W[j] = E[j-1], so logits peak at t+1
    (E[t].E[t] beats any E[k].E[t]; the margin is ~2.4 logits before softcapping, tanh keeps the argmax);
  * assistant: pre_projection = [I_A 0 | 0] (takes the first A dims of the token-embedding half of
    concat(embed, target hidden), ignores the target hidden), its tied embed/lm_head rows are E[j-1][:A], and for
    the centroid head (e-series) centroid c's weight is the one-hot of code dim c, so the cluster of t+1 always
    scores highest and is inside the top-k; token_ordering is a random permutation (shape-true routing).
  So greedy MTP must agree with greedy decoding exactly and every drafted token is accepted.
  Note: sglang and transformers both feed the assistant the *target's* scaled embedding, so the assistant's own
  embed_tokens only serves as the tied lm_head.

Folders: ``root/<name>[-constructed]/{target,assistant}`` plus ``.mtpmatrix-tiny.json`` (the marker, with a hash of
the templates + code version). Builds go to a temp dir that is renamed into place, so a finished folder is
reused as is and an interrupted build is never mistaken for a finished one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core.settings import TINY_PAIR_NAMES as PAIR_NAMES
from mtpmatrix.pairs.decoy import make_decoy
from mtpmatrix.pairs.long_witness import CONTEXT_LEN, make_long_witness
from mtpmatrix.pairs.sampled.weights import make_sampled
from mtpmatrix.pairs.weights import centroid_cluster_of, write_target_head, zero_residual_writers
from mtpmatrix.pairs.witness import make_witness, phase_of_variant

CODE_VERSION = "tiny-v3"  # v2: MoE experts share weights; v3: two physical layers per type, witness variant
MARKER = ".mtpmatrix-tiny.json"
DTYPE = "bfloat16"

VOCAB = 512
TARGET_HIDDEN = 128
ASSISTANT_HIDDEN = 64
SLIDING_WINDOW = 64  # small, so sglang prompts > 64 tokens exercise SWA; transformers cannot crop a sliding cache
# that has seen more than the window (assisted decoding rejects drafts by cropping), so reference prompts stay inside it

# Token ids: Gemma's fixed low ids, then the multimodal / chat markers, then 256 byte-fallback tokens, then ASCII.
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<|image>": 4,
    "<image|>": 5,
    "<|image|>": 6,
    "<|video|>": 7,
    "<|audio>": 8,
    "<audio|>": 9,
    "<|audio|>": 10,
    "<|turn>": 11,
    "<turn|>": 12,
    "<mask>": 13,
}
MM_TOKEN_IDS = {
    "boi_token_id": 4,
    "eoi_token_id": 5,
    "image_token_id": 6,
    "video_token_id": 7,
    "boa_token_id": 8,
    "eoa_token_index": 9,
    "eoa_token_id": 9,
    "audio_token_id": 10,
}
END_OF_TURN_ID = 12
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)

_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def _text(**over) -> dict:
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
    "e-series": _text(
        num_hidden_layers=8,
        layer_types=_E_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
    ),
    "moe-26b-a4b": _text(
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
    "dense-31b": _text(
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


# witness: built for transformers' draft phase; witness-sglang-phase: for sglang's (mtpmatrix.pairs.witness, "Draft phase")
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
    text = _text(
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


@dataclass(frozen=True)
class PairPaths:
    name: str
    target: Path
    assistant: Path
    constructed: bool
    variant: str = "random"


def pair_hash(name: str, variant: str | bool, seed: int) -> str:
    variant = variant_name(variant)
    # a witness pair is also rebuilt whenever its construction changes
    sources = {
        "witness": ("witness.py", "weights.py"),
        "decoy": ("witness.py", "decoy.py", "weights.py"),
        "sampled": ("sampled/ring.py", "sampled/bonus.py", "sampled/weights.py", "weights.py"),
        "long": ("long_witness.py", "witness.py", "weights.py"),
    }.get(variant.split("-")[0], ())
    witness_src = b"".join((Path(__file__).parent / f).read_bytes() for f in sources)
    phase = phase_of_variant(variant) if sources and variant != "sampled" else None  # follows the installed sglang
    blob = json.dumps(
        {
            "code": CODE_VERSION,
            "variant": variant,
            "witness": hashlib.sha256(witness_src).hexdigest(),
            "phase": phase,
            "target": target_template(name, variant),
            "assistant": assistant_template(name, variant),
            "seed": seed,
            "tokenizer": SPECIAL_TOKENS,
            "generation": generation_config(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _usable(folder: Path, digest: str) -> bool:
    m = read_marker(folder)
    if not m or m.get("hash") != digest:
        return False
    if m.get("weights"):
        return True
    # No weights last time (e.g. a transformers without Gemma 4): retry if this one may have the classes.
    return not _has_model_classes()


def _has_model_classes() -> bool:
    try:
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration  # noqa: F401
    except Exception:
        return False
    return True


def build_pair(
    name: str, root: Path, *, variant: str | bool = "random", constructed: bool | None = None, seed: int = 0
) -> PairPaths:
    """Build (or reuse) the tiny pair ``name`` under ``root``; see the module docstring."""
    if name not in PAIR_NAMES:
        raise ValueError(f"unknown tiny pair {name!r}; known: {', '.join(PAIR_NAMES)}")
    root = Path(root)
    variant = variant_name(constructed if constructed is not None else variant)
    dest = root / (name + ("" if variant == "random" else f"-{variant}"))
    paths = PairPaths(
        name=name,
        target=dest / "target",
        assistant=dest / "assistant",
        constructed=variant == "constructed",
        variant=variant,
    )
    digest = pair_hash(name, variant, seed)
    if _usable(dest, digest):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=root))
    try:
        marker = _build_into(tmp, name, variant, seed)
        marker["hash"] = digest
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            if _usable(dest, digest):  # a concurrent build finished first
                return paths
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not _usable(dest, digest):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


# ---------------------------------------------------------------------------------------------- building


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _build_into(folder: Path, name: str, variant: str, seed: int) -> dict:
    t_dir, a_dir = folder / "target", folder / "assistant"
    t_cfg, a_cfg = target_template(name, variant), assistant_template(name, variant)
    marker: dict = {
        "name": name,
        "variant": variant,
        "constructed": variant == "constructed",
        "seed": seed,
        "code_version": CODE_VERSION,
        "dtype": DTYPE,
        "weights": False,
        "weights_error": None,
        "processor": False,
        "processor_error": None,
    }
    try:
        import transformers

        marker["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        marker["transformers"] = None
        marker["weights_error"] = f"transformers does not import: {exc}"

    tokenizer = _make_tokenizer()
    for d in (t_dir, a_dir):
        tokenizer.save_pretrained(d)
        _write_json(d / "generation_config.json", generation_config())
    try:
        _save_processor(tokenizer, t_dir)
        marker["processor"] = True
    except Exception as exc:  # noqa: BLE001 - recorded; the folder is still shape-true for text-only serving
        marker["processor_error"] = f"{type(exc).__name__}: {exc}"[:300]

    if marker["transformers"] is not None:
        try:
            marker.update(_save_weights(name, t_cfg, a_cfg, t_dir, a_dir, variant, seed))
            marker["weights"] = True
        except Exception as exc:  # noqa: BLE001 - a transformers that cannot build the classes: files stay
            marker["weights_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # config.json always comes from the templates (written last: save_pretrained must not overwrite it).
    _write_json(t_dir / "config.json", t_cfg)
    _write_json(a_dir / "config.json", a_cfg)
    return marker


def _make_tokenizer():
    """A byte-fallback char-level tokenizer covering printable ASCII, with Gemma's special tokens."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = dict(SPECIAL_TOKENS)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab.setdefault(c, len(vocab))
    i = 0
    while len(vocab) < VOCAB:
        vocab[f"<unused{i}>"] = len(vocab)
        i += 1
    assert len(vocab) == VOCAB, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
            "sot_token": "<|turn>",
            "eot_token": "<turn|>",
        },
    )


def _save_processor(tokenizer, folder: Path) -> None:
    from transformers.models.gemma4 import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    proc = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    proc.save_pretrained(folder)


def _save_weights(name: str, t_cfg: dict, a_cfg: dict, t_dir: Path, a_dir: Path, variant: str, seed: int) -> dict:
    import torch
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
    )

    cfg_t = Gemma4Config(**_config_kwargs(t_cfg))
    cfg_a = Gemma4AssistantConfig(**_config_kwargs(a_cfg))
    torch.manual_seed(seed)
    target = Gemma4ForConditionalGeneration(cfg_t).float().eval()
    assistant = Gemma4AssistantForCausalLM(cfg_a).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if assistant.masked_embedding is not None:  # HF init zeroes it: a real permutation, as in checkpoints
            perm = torch.randperm(VOCAB, generator=gen)
            assistant.masked_embedding.token_ordering.copy_(perm)
        _share_expert_weights(target.model.language_model)
        extra: dict = {}
        if variant == "constructed":
            _make_plus_one(target, assistant, a_cfg, gen)
        elif variant.startswith("witness"):
            extra = make_witness(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
        elif variant == "sampled":
            extra = make_sampled(target, assistant, t_cfg, a_cfg)
        elif variant.startswith("decoy"):
            extra = make_decoy(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
        elif variant.startswith("long-witness"):
            extra = make_long_witness(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
    target.to(torch.bfloat16).save_pretrained(t_dir, safe_serialization=True)
    assistant.to(torch.bfloat16).save_pretrained(a_dir, safe_serialization=True)
    for d in (t_dir, a_dir):  # the templates are the config; drop transformers' own generation_config guess
        _write_json(d / "generation_config.json", generation_config())
    return extra


def _config_kwargs(cfg: dict) -> dict:
    out = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "dtype", "eoa_token_id")}
    for sub in ("text_config", "vision_config", "audio_config"):
        if isinstance(out.get(sub), dict):
            out[sub] = {k: v for k, v in out[sub].items() if k not in ("model_type", "dtype")}
    return out


def _share_expert_weights(text_model) -> None:
    """Every MoE expert of a layer computes what expert 0 computes (routing then cannot change the output)."""
    for layer in text_model.layers:
        experts = getattr(layer, "experts", None)
        if experts is not None:
            experts.gate_up_proj.copy_(experts.gate_up_proj[:1].expand_as(experts.gate_up_proj))
            experts.down_proj.copy_(experts.down_proj[:1].expand_as(experts.down_proj))


def _make_plus_one(target, assistant, a_cfg: dict, gen) -> None:
    import torch

    A = ASSISTANT_HIDDEN
    lm = target.model.language_model
    H = lm.config.hidden_size
    centroid = bool(a_cfg["use_ordered_embeddings"])
    E = torch.zeros(VOCAB, H)
    if centroid:
        C = a_cfg["num_centroids"]
        cluster_of = centroid_cluster_of(assistant, VOCAB, C)
        r = torch.randn(VOCAB, A - C, generator=gen)
        E[:, C:A] = r / r.norm(dim=-1, keepdim=True)
        nxt = (torch.arange(VOCAB) + 1) % VOCAB
        E[torch.arange(VOCAB), cluster_of[nxt]] = 1.0  # code of the cluster holding t+1
        cw = torch.zeros(C, A)
        cw[torch.arange(C), torch.arange(C)] = 1.0
        assistant.masked_embedding.centroids.weight.copy_(cw)
    else:
        r = torch.randn(VOCAB, A, generator=gen)
        E[:, :A] = r / r.norm(dim=-1, keepdim=True)
    shifted = torch.roll(E, shifts=1, dims=0)  # shifted[j] = E[j-1]
    write_target_head(target, E, shifted, "constructed")

    P = torch.zeros(A, 2 * H)
    P[torch.arange(A), torch.arange(A)] = 1.0
    assistant.pre_projection.weight.copy_(P)
    assistant.model.embed_tokens.weight.copy_(shifted[:, :A])  # tied lm_head
    assistant.lm_head.weight.copy_(shifted[:, :A])
    zero_residual_writers(assistant.model)
    assistant.model.norm.weight.fill_(1.0)
