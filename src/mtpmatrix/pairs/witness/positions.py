"""Position selection by RoPE alone: the witness's query and keys carry no content in their rotating pairs, only
per-pair amplitudes, so the score at relative offset d is G * sum_i a_i^2 cos(w_i (d - phase)); it peaks at
d = phase, and ``position_margin`` says by how many nats over every other offset."""

from __future__ import annotations


def rope_inv_freq(text_cfg: dict, layer_type: str):
    """The inverse RoPE frequencies transformers and sglang use for ``layer_type`` (pairs (i, i + head_dim/2))."""
    import torch

    rope = text_cfg["rope_parameters"][layer_type]
    if layer_type == "full_attention":
        head_dim = text_cfg.get("global_head_dim") or text_cfg["head_dim"]
    else:
        head_dim = text_cfg["head_dim"]
    base = rope["rope_theta"]
    if rope.get("rope_type") == "proportional":
        rotated = int(rope.get("partial_rotary_factor", 1.0) * head_dim // 2)
    else:
        rotated = head_dim // 2
    inv = 1.0 / base ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float64) / head_dim)
    return head_dim, inv.float()


def pair_amplitudes(inv_freq):
    """Per-pair amplitude of the position-only query/key: only pairs that rotate, weighted to the fast ones (they
    separate neighbouring offsets); unit norm."""
    import torch

    a = torch.where(inv_freq > 0, 1.0 / (1.0 + 4.0 * (1.0 - inv_freq.clamp(max=1.0))), torch.zeros_like(inv_freq))
    return a / a.norm()


def position_scores(inv_freq, amps, gain: float, max_offset: int = 600):
    """Attention score of the witness query on keys 0..max_offset positions back."""
    import torch

    d = torch.arange(0, max_offset + 1, dtype=torch.float64)
    return gain * (amps.double()[None, :] ** 2 * torch.cos(d[:, None] * inv_freq.double()[None, :])).sum(-1)


def position_margin(inv_freq, amps, gain: float, max_offset: int = 600) -> float:
    """Score at offset 0 minus the best score at any other offset up to ``max_offset`` (nats)."""
    s = position_scores(inv_freq, amps, gain, max_offset)
    return float(s[0] - s[1:].max())
