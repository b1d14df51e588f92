"""A tiny pair's weights: transformers' own seeded init of the models the templates describe, the variant's
construction written over it, saved as bf16 safetensors.

In the MoE family every expert of a layer gets the same weights (the router still routes, and sglang's fused MoE
kernels still run). A random router scores its experts within a hair of each other, so bf16 rounding that differs
between a 12-token verify pass and a 1-token decode step flipped expert choices and moved the logits by up to 0.1
nats (2x H200, TP 2, sglang 0.5.17), beyond the smoke tier's near-tie bar; with shared experts the output does not
depend on which experts win, so MTP-vs-no-MTP divergences are bf16 near-ties again, as in the dense families.
"""

from __future__ import annotations

from pathlib import Path

from mtpmatrix.pairs.decoy import make_decoy
from mtpmatrix.pairs.long_witness_weights import make_long_witness
from mtpmatrix.pairs.plus_one import make_plus_one
from mtpmatrix.pairs.sampled.weights import make_sampled
from mtpmatrix.pairs.tiny.configs import config_kwargs, generation_config, write_json
from mtpmatrix.pairs.tiny.vocab import VOCAB
from mtpmatrix.pairs.witness.phase import phase_of_variant
from mtpmatrix.pairs.witness.weights import make_witness


def save_weights(t_cfg: dict, a_cfg: dict, t_dir: Path, a_dir: Path, variant: str, seed: int) -> dict:
    """Instantiate target and assistant from their templates (seeded), write ``variant``'s construction into them and
    save both as bf16 safetensors; returns what the construction reports for the pair's marker."""
    import torch
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
    )

    cfg_t = Gemma4Config(**config_kwargs(t_cfg))
    cfg_a = Gemma4AssistantConfig(**config_kwargs(a_cfg))
    torch.manual_seed(seed)
    target = Gemma4ForConditionalGeneration(cfg_t).float().eval()
    assistant = Gemma4AssistantForCausalLM(cfg_a).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if assistant.masked_embedding is not None:  # HF init zeroes it: a real permutation, as in checkpoints
            perm = torch.randperm(VOCAB, generator=gen)
            assistant.masked_embedding.token_ordering.copy_(perm)
        _share_expert_weights(target.model.language_model)
        extra = _construct(variant, target, assistant, t_cfg, a_cfg, gen)
    target.to(torch.bfloat16).save_pretrained(t_dir, safe_serialization=True)
    assistant.to(torch.bfloat16).save_pretrained(a_dir, safe_serialization=True)
    for d in (t_dir, a_dir):  # the templates are the config; drop transformers' own generation_config guess
        write_json(d / "generation_config.json", generation_config())
    return extra


def _construct(variant: str, target, assistant, t_cfg: dict, a_cfg: dict, gen) -> dict:
    """Write ``variant``'s construction over the random weights (``random``: none); returns its marker numbers."""
    if variant == "constructed":
        make_plus_one(target, assistant, a_cfg, gen)
    elif variant.startswith("witness"):
        return make_witness(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
    elif variant == "sampled":
        return make_sampled(target, assistant, t_cfg, a_cfg)
    elif variant.startswith("decoy"):
        return make_decoy(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
    elif variant.startswith("long-witness"):
        return make_long_witness(target, assistant, t_cfg, a_cfg, gen, phase=phase_of_variant(variant))
    return {}


def _share_expert_weights(text_model) -> None:
    """Every MoE expert of a layer computes what expert 0 computes (routing then cannot change the output)."""
    for layer in text_model.layers:
        experts = getattr(layer, "experts", None)
        if experts is not None:
            experts.gate_up_proj.copy_(experts.gate_up_proj[:1].expand_as(experts.gate_up_proj))
            experts.down_proj.copy_(experts.down_proj[:1].expand_as(experts.down_proj))
