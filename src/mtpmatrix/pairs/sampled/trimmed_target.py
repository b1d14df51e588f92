"""The sampled pair's target with only the layers anything reads, for transformers' sampling checks (issue #31).

Why: transformers' assisted generation takes one sequence at a time, so the reference tier's assisted-sampling check
(tests/tiers/test_reference.py) pays ~1,220 verify rounds of Python per layer, and on the tiny pairs a target
forward costs about its layer count. The sampled target's layers write nothing to the residual stream
(``weights.zero_residual_writers``): its logits and hidden states are those of its embedding alone, and a layer is
read only through its K/V, which the assistant takes from the target's last layer of each attention type. A copy
holding just those layers (dense-31b: layers 4 and 5 of 6) gives the same logits, hidden states and K/V bit for bit,
so the same drafts, coins and tokens; measured on the check's 32 requests (the same 1536 tokens), CPU seconds back to
back (load ~1.7): transformers 5.12.1 17.1 -> 14.0 and 14.0 -> 11.9, 5.8.1 17.4 -> 14.2 and 13.1 -> 10.8.

The closed-form check of transformers' plain sampling (``test_sampled_closed_form_matches_transformers_sampling``)
generates from the same copy, for the same reason: its 512-row steps pay per layer in arithmetic, and dense-31b and
moe-26b-a4b took ~40 % less CPU with the same tokens (0.5.13 and 0.5.17, back to back).

``kv_source_copy`` proves the sameness on the check's own prompts before the check uses the copy (logits, the last
hidden state and the kept layers' K/V, ``torch.equal``) and returns None when anything differs or the copy cannot be
built (a target with per-layer inputs or shared KV, e-series; a transformers whose config refuses the change): the
check then runs the pair's own target, so which one ran never changes a record.
"""

from __future__ import annotations

import copy
import re


def kept_layers(layer_types: list[str]) -> list[int]:
    """The last layer of each attention type, in order: the layers whose K/V the assistant reads."""
    last = {t: i for i, t in enumerate(layer_types)}
    return sorted(last.values())


def kv_source_copy(target, prompts):
    """A copy of ``target`` with only ``kept_layers``, checked equal to it on ``prompts`` (a batch of token ids,
    shape (B, L)); None when it is not (the caller then keeps ``target``)."""
    try:
        trimmed = _trimmed(target)
    except Exception:  # noqa: BLE001 - any refusal means: run the pair's own target
        return None
    return trimmed if _same_outputs(target, trimmed, prompts) else None


def _trimmed(target):
    import torch

    text = target.config.get_text_config()
    if getattr(text, "num_kv_shared_layers", 0) or getattr(text, "hidden_size_per_layer_input", 0):
        return None  # a layer read through another's KV, or per-layer inputs: not the sampled dense shape
    types = list(text.layer_types)
    keep = kept_layers(types)
    if getattr(text, "per_layer_config", None):
        config = _renumbered_config(target.config, keep)
    else:
        config = copy.deepcopy(target.config)
        lean = config.get_text_config()
        lean.num_hidden_layers = len(keep)
        lean.layer_types = [types[i] for i in keep]
    trimmed = type(target)(config).to(torch.float32).eval()
    state = {}
    for key, value in target.state_dict().items():
        layer = re.search(r"language_model\.layers\.(\d+)\.", key)
        if layer:
            index = int(layer.group(1))
            if index not in keep:
                continue
            key = key.replace(f"layers.{index}.", f"layers.{keep.index(index)}.", 1)
        state[key] = value
    trimmed.load_state_dict(state, strict=True)
    trimmed.generation_config = copy.deepcopy(target.generation_config)
    return trimmed


def _renumbered_config(config, keep: list[int]):
    """``config`` with only the text layers ``keep``, for a transformers (>= 5.19) that keeps per-layer attributes
    (a full layer's head_dim, KV heads) in ``per_layer_config`` by layer index and derives the layers' shapes from
    it when the config is built: the overrides follow their layers to the new indices, and the config is built
    again from its dict (setting the attributes on a built config leaves the shapes of the old indices)."""
    data = config.to_dict()
    text = data["text_config"] if "text_config" in data else data
    text["layer_types"] = [text["layer_types"][i] for i in keep]
    text["num_hidden_layers"] = len(keep)
    per = text.get("per_layer_config") or {}
    text["per_layer_config"] = {str(j): per[str(i)] for j, i in enumerate(keep) if str(i) in per}
    return type(config).from_dict(data)


def _same_outputs(target, trimmed, prompts) -> bool:
    import torch

    if trimmed is None:
        return False
    keep = kept_layers(list(target.config.get_text_config().layer_types))
    try:
        with torch.inference_mode():
            full = target(prompts, use_cache=True, output_hidden_states=True)
            lean = trimmed(prompts, use_cache=True, output_hidden_states=True)
        pairs = [(full.logits, lean.logits), (full.hidden_states[-1], lean.hidden_states[-1])]
        for j, i in enumerate(keep):
            a, b = full.past_key_values.layers[i], lean.past_key_values.layers[j]
            pairs += [(a.keys, b.keys), (a.values, b.values)]
        return all(torch.equal(x, y) for x, y in pairs)
    except Exception:  # noqa: BLE001 - a cache without .layers, or any other difference: not proven the same
        return False
