"""Witness pairs: tiny Gemma 4 target + assistant whose drafts are right only when sglang's Frozen-KV MTP path
hands the assistant every input it is supposed to.

Why: the constructed "+1" pair drafts from the token embedding alone, so it accepted 5.33 of 6 tokens whatever
hidden state, KV cache or positions sglang gave it; it could not see a broken hand-off. A witness assistant needs
each input, and a wrong one makes its draft wrong, so the accept length collapses while the output stays lossless
(the class of bug the seed suite's accept-length gate exists for).

The target stays trivially exact: next token = current + 1 (mod vocab), so the greedy output is known and the smoke
tier can still demand it token for token.

Construction (all arithmetic exact up to bf16 rounding; every vector below has a fixed norm)
-----------------------------------------------------------------------------------------------
Codes: c(t) is a unit "token code" in D dims (a spread-out spherical code: its largest cross-cosine is printed by
``code_margin``), n_s(t) and n_f(t) are unit "anchor codes" in D_ANCHOR dims (random), L is a random orthogonal
DxD matrix, M_s, M_f embed D_ANCHOR dims isometrically into D dims.

Target embedding row E[t] (unit norm, so the scaled embedding sqrt(H)*E[t] has RMS 1 and RMSNorm with weight 1
leaves it unchanged: the target's pre-norm and post-norm hidden states are the same vector) holds, in disjoint
dims: a constant, c(t) ("own"), c(t+1) ("next"), n_s(t), n_f(t) and, for the centroid head, the one-hot of the
cluster that holds t+1. Every target layer writes nothing to the residual stream (o_proj, MLP/MoE down
projections and PLE projections are zero), so the target's hidden state at position p is exactly sqrt(H)*E[x_p].
Its output head reads the "next" dims: logits peak at x_p + 1.

The target's attention projections do not touch its output (o_proj is zero), so they are free to shape the KV
cache the assistant reads:
  * every layer's key is the same position-only vector (the constant dim through k_proj; RoPE adds the position);
  * the value of the *owner* layers sglang binds (the last non-KV-shared layer of each attention type) carries the
    anchor code of its own token: n_s(x_p) on the sliding owner, n_f(x_p) on the full owner; every other layer's
    value carries c(x_p) through a random map, so reading the wrong layer reads something that does not cancel.

Assistant step (input token t, recurrent state r; at the seed step r is the target's hidden at the last accepted
position and t the bonus token; later r = post_projection of the parent node's output):

    z = pre_projection([sqrt(H) E[t], r]):
        code dims  +=  c(t+1)  +  ALPHA*L c(t)  -  ALPHA*L c(r.next)  +  BETA*M_s r.n_s  +  BETA*M_f r.n_f
        keep dims   =  r.n_s, r.n_f                 (carried to the next step unchanged)
        cluster     =  one-hot cluster of t+1       (centroid head only)
    sliding layer: the query is position-only and peaks on the key ``phase`` positions before its own RoPE
        position (see "Draft phase" below): the last accepted token's, so it reads that token's value
        n_s(x_last) and adds  -BETA*M_s n_s(x_last)  to the code dims (post-attention RMSNorm fixes the size);
    full layer: the same with n_f;
    output: lm_head reads the code dims; post_projection writes code -> r.next, keep -> r.n_s / r.n_f.

With every input right the nuisance terms cancel and the code dims hold exactly c(t+1): the draft is t+1 and the
next state carries next = c(t+1). Each input the path hands over appears in exactly one cancellation:
  * hidden state of another position (block's first, stale): r.next != c(t) and r.n_* != n_*(x_last);
  * KV of another layer: the value read is not n_*(x_last);
  * draft positions shifted by one: the query reads the neighbour's key;
  * at topk > 1, a node fed another node's parent state: r.next is the code of another token;
  * another request's rows: both hidden state and KV belong to another sequence.
An uncancelled term adds a vector of norm ~ALPHA*sqrt(2) (or BETA*sqrt(2)) = 5.7 to a code of norm 1 in the code
dims, so the draft lands on an unrelated token: the ablations of ``witness_harness.draft_rounds`` drop the accepted
drafts per round from ~5 of 5 to ~0.

Position selection: query and key use the same per-pair RoPE amplitudes, so the score at relative offset d is
G * sum_i a_i cos(w_i (d - phase)); it peaks at d = phase and the next best offset is at least ``position_margin`` nats lower
(printed by ``witness_report``; > 10 nats, so the neighbours carry < 1e-4 of the attention).

Draft phase (the witness's one free convention)
-----------------------------------------------
The *draft phase* is the draft query's RoPE position minus the RoPE position of the last accepted token's key. The
witness query peaks on the key ``phase`` positions before itself, so a witness drafts right only under the phase it
was built for:
  * transformers (the reference): ``SinglePositionMultiTokenCandidateGenerator`` puts the query at the bonus token's
    position ``input_ids.shape[1] - 1`` and the target's keys sit at 0-based positions: phase +1
    (``REFERENCE_DRAFT_PHASE``; the reference tier checks it with transformers' own assisted generation);
  * sglang 0.5.13-0.5.23 with a ``Gemma4ForConditionalGeneration`` target (every Gemma 4 checkpoint): the target
    writes its keys at position + 1 (``gemma4_mm.py``: ``positions += 1``) and the draft query sits at
    ``seq_lens - 1`` (``frozen_kv_mtp_utils.set_frozen_kv_positions``), so the last accepted key is one position
    *after* the query: phase -1 (``SGLANG_DRAFT_PHASES``, by release). Measured on an H200 (sglang 0.5.17) by dumping the draft
    forward's q and the target's frozen K: slot j's key carries RoPE position j + 1, the query seq_lens - 1.
Pair variants: ``witness`` is built for the reference phase, ``witness-sglang-phase`` for sglang's. The smoke tier
gates hand-offs with the sglang-phase witness and reports the phase difference itself with the reference witness
(``known_upstream.json``: sglang-gemma4-mtp-draft-rope-phase).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mtpmatrix.core import schema
from mtpmatrix.pairs.weights import centroid_cluster_of, zero_residual_writers

D_CODE = 14
D_NUISANCE = 14
D_ANCHOR = 8
NUISANCE_READOUT = 1.0  # how strongly the output head reads the nuisance dims (see the module docstring)
ALPHA = 4.0
BETA = 4.0
LOGIT_PEAK = 20.0  # target and assistant logits at the argmax (below the 30.0 softcap)
SCORE_GAIN = (
    112.0  # attention score at the peak offset: margins of ~20 (sliding) / ~15 (full) nats, see position_margin
)
# Draft phase = the draft query's RoPE position minus that of the last accepted token's key (module docstring).
REFERENCE_DRAFT_PHASE = 1  # transformers: query at the bonus token's position, keys at 0-based positions
# sglang releases -> the draft phase they draft at (Gemma4ForConditionalGeneration target: keys at position + 1,
# query at seq_lens - 1). Measured on an H200 for 0.5.13 and 0.5.17; 0.5.23 has the same code. A release outside
# every range is expected at the reference phase: if it is not, the sglang-phase witness collapses and says so, and
# the range here (and in known_upstream.json) is what to extend.
SGLANG_DRAFT_PHASES = ((">=0.5.13,<=0.5.23", -1),)
DRAFT_PHASE_ENV = schema.DRAFT_PHASE_ENV


def sglang_draft_phase(version: str | None = None) -> int:
    """The draft phase of sglang ``version`` (default: the installed one; without sglang, the newest measured). A
    candidate that moves the phase declares it (MTPMATRIX_DRAFT_PHASE, runner/candidate.py): the installed sglang is
    then no release this table knows, and the evidence judge accepts the knob only beside the same declaration in the
    candidate's record."""
    from mtpmatrix.serving.environment import by_release, version_of

    declared = os.environ.get(DRAFT_PHASE_ENV, "").strip()
    if declared and version is None:
        try:
            return int(declared)
        except ValueError:
            raise ValueError(f"{DRAFT_PHASE_ENV}={declared!r}: not a whole number (e.g. +1)") from None
    version = version or version_of("sglang")
    if not version:
        return SGLANG_DRAFT_PHASES[-1][1]
    return by_release(SGLANG_DRAFT_PHASES, version, REFERENCE_DRAFT_PHASE)


def phase_of_variant(variant: str) -> int:
    """The draft phase a witness pair variant's assistant is built for: ``witness`` / ``decoy`` transformers', the
    ``*-sglang-phase`` ones the installed sglang's."""
    return sglang_draft_phase() if variant.endswith("-sglang-phase") else REFERENCE_DRAFT_PHASE


def _consecutive(parts: list[tuple[str, int]], start: int = 1) -> dict[str, slice]:
    """Slices of consecutive dims, in order, after ``start`` leading dims (dim 0 holds the constant)."""
    out = {}
    for name, size in parts:
        out[name] = slice(start, start + size)
        start += size
    return out


@dataclass(frozen=True)
class Layout:
    """Which dims of the target hidden (backbone) and of the assistant hidden hold what. Dim 0 of each holds the
    constant (``b_const`` / ``a_const``); the named parts follow in this order."""

    backbone: int
    assistant: int
    centroids: int  # 0 without a centroid head
    extra_backbone: tuple = ()  # (name, size) parts a WitnessExtension adds after the witness's own
    extra_assistant: tuple = ()

    b_const = a_const = 0

    def __post_init__(self):
        backbone = _consecutive(
            [
                ("own", D_CODE),
                ("next", D_CODE),
                ("anchor_s", D_ANCHOR),
                ("anchor_f", D_ANCHOR),
                ("cluster", self.centroids),
                *self.extra_backbone,
            ]
        )
        assistant = _consecutive(
            [
                ("code", D_CODE),
                ("nuisance", D_NUISANCE),
                ("keep_s", D_ANCHOR),
                ("keep_f", D_ANCHOR),
                ("cluster", self.centroids),
                *self.extra_assistant,
            ]
        )
        for prefix, parts in (("b_", backbone), ("a_", assistant)):
            for name, sl in parts.items():
                object.__setattr__(self, prefix + name, sl)  # frozen: set once, here
        object.__setattr__(
            self, "_ends", (max(sl.stop for sl in backbone.values()), max(sl.stop for sl in assistant.values()))
        )

    def check(self) -> None:
        b_end, a_end = self._ends
        if b_end > self.backbone or a_end > self.assistant:
            raise ValueError(
                f"witness layout does not fit: backbone {b_end}/{self.backbone}, assistant {a_end}/{self.assistant}"
            )


# Sizes of the assistant residual's parts (their squares add up to the residual's squared norm after the two
# cancellations, which fixes the final RMSNorm's divisor).
KAPPA_CONST = 1.0
KAPPA_KEEP = 1.0
ZETA_CLUSTER = 1.5
# Share of the target embedding's unit norm: the constant, then the code parts equally.
EMBED_CONST = 0.3
# When the value shares the key projection (attention_k_eq_v), the key's position part is scaled up so it keeps most
# of the key's norm after k_norm (the value's anchor part is renormalised downstream anyway).
K_POS_SCALE_SHARED = 3.0


# spherical_code's results by (n, dim, steps, generator state): every witness and decoy variant of every family
# draws the same code from the same seed, and the repulsion is ~1.2 s of CPU a call (issue #21: 9 calls a row).
_CODES: dict[tuple, object] = {}


def spherical_code(n: int, dim: int, gen, steps: int = 300):
    """``n`` unit vectors in ``dim`` dims, spread apart by a short repulsion (deterministic for a seeded gen).
    Computed once per process for a given generator state; ``gen`` always advances as the draw moves it."""
    import torch

    key = (n, dim, steps, gen.get_state().numpy().tobytes())
    x = torch.randn(n, dim, generator=gen, dtype=torch.float64)  # drawn even when known: gen moves as it always did
    if key in _CODES:
        return _CODES[key].clone()
    _CODES[key] = code = _repel(x, steps)
    return code.clone()


def _repel(x, steps: int):
    import torch

    x = x / x.norm(dim=1, keepdim=True)
    eye = torch.eye(x.shape[0], dtype=torch.bool)
    with torch.enable_grad():  # callers build weights under no_grad
        x.requires_grad_(True)
        opt = torch.optim.Adam([x], lr=0.02)
        for _ in range(steps):
            u = x / x.norm(dim=1, keepdim=True)
            cos = (u @ u.T).masked_fill(eye, -1.0)
            loss = torch.logsumexp(12.0 * cos, dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        u = x / x.norm(dim=1, keepdim=True)
    return u.detach().float()


def code_margin(codes) -> float:
    """1 - the largest cosine between two different codes (the decoding margin per unit of signal)."""
    cos = codes @ codes.T
    cos.fill_diagonal_(-1.0)
    return float(1.0 - cos.max())


def orthogonal_columns(n: int, m: int, gen):
    """An n x m matrix with orthonormal columns (n >= m)."""
    import torch

    q, _ = torch.linalg.qr(torch.randn(n, m, generator=gen))
    return q[:, :m]


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


def make_witness(
    target, assistant, t_cfg: dict, a_cfg: dict, gen, phase: int = REFERENCE_DRAFT_PHASE, extension=None
) -> dict:
    """Overwrite the weights of freshly initialised fp32 ``target`` / ``assistant`` with the witness construction,
    its assistant built for draft ``phase`` (module docstring).

    ``extension`` (e.g. ``mtpmatrix.pairs.decoy.DecoyExtension``) adds to the construction without changing
    it: dims after the witness's own (``backbone_parts`` / ``assistant_parts``), ``embed_parts`` more unit parts
    in every embedding row (written by ``embed(E, ctx)``, the other parts shrink to keep rows at unit norm),
    ``extra_sq`` more squared norm in the assistant residual at every intact step (the final norm's divisor), and
    ``apply(target, assistant, ctx)`` once the witness weights are in place. Without it the weights are the plain
    witness's, bit for bit.

    Returns numbers worth keeping in the pair's marker (margins the construction relies on).
    """
    import torch

    text = t_cfg["text_config"]
    V, H = text["vocab_size"], text["hidden_size"]
    A = a_cfg["text_config"]["hidden_size"]
    centroid = bool(a_cfg.get("use_ordered_embeddings"))
    C = a_cfg["num_centroids"] if centroid else 0
    lay = Layout(
        backbone=H,
        assistant=A,
        centroids=C,
        extra_backbone=tuple(getattr(extension, "backbone_parts", ())),
        extra_assistant=tuple(getattr(extension, "assistant_parts", ())),
    )
    lay.check()
    u = H**0.5

    codes = spherical_code(V, D_CODE, gen)
    anchor_s = torch.randn(V, D_ANCHOR, generator=gen)
    anchor_s = anchor_s / anchor_s.norm(dim=1, keepdim=True)
    anchor_f = torch.randn(V, D_ANCHOR, generator=gen)
    anchor_f = anchor_f / anchor_f.norm(dim=1, keepdim=True)
    L = (
        orthogonal_columns(D_NUISANCE, D_CODE, gen)
        if D_NUISANCE >= D_CODE
        else orthogonal_columns(D_CODE, D_NUISANCE, gen).T
    )
    M_s = orthogonal_columns(D_NUISANCE, D_ANCHOR, gen)
    M_f = orthogonal_columns(D_NUISANCE, D_ANCHOR, gen)
    readout = torch.randn(V, D_NUISANCE, generator=gen)
    readout = readout / readout.norm(dim=1, keepdim=True)
    nxt = (torch.arange(V) + 1) % V

    # --- target embedding: constant, own code, next code, anchors, cluster of t+1 (centroid head) --------------
    parts = 4 + (1 if centroid else 0) + (extension.embed_parts if extension else 0)
    s_part = ((1.0 - EMBED_CONST**2) / parts) ** 0.5
    E = torch.zeros(V, H)
    E[:, lay.b_const] = EMBED_CONST
    E[:, lay.b_own] = s_part * codes
    E[:, lay.b_next] = s_part * codes[nxt]
    E[:, lay.b_anchor_s] = s_part * anchor_s
    E[:, lay.b_anchor_f] = s_part * anchor_f
    cluster_of = None
    if centroid:
        cluster_of = centroid_cluster_of(assistant, V, C)
        E[torch.arange(V), lay.b_cluster.start + cluster_of[nxt]] = s_part
    ctx = {"lay": lay, "s_part": s_part, "u": u, "codes": codes, "cluster_of": cluster_of, "gen": gen}
    if extension:
        extension.embed(E, ctx)
    E = E / E.norm(dim=1, keepdim=True)

    lm = target.model.language_model
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(E)
        head = torch.zeros(V, H)
        head[:, lay.b_next] = codes * (LOGIT_PEAK / (u * s_part))
        target.lm_head.weight.copy_(head)
        lm.norm.weight.fill_(1.0)
        _witness_target_layers(lm, text, lay, gen)
        ctx["R"] = _witness_assistant(
            assistant,
            a_cfg,
            text,
            lay,
            codes,
            readout,
            L,
            M_s,
            M_f,
            s_part,
            u,
            phase,
            extension.extra_sq if extension else 0.0,
        )
        extra = extension.apply(target, assistant, ctx) if extension else {}

    h_dim_s, inv_s = rope_inv_freq(text, "sliding_attention")
    h_dim_f, inv_f = rope_inv_freq(text, "full_attention")
    return {
        "witness": {
            "code_margin": round(code_margin(codes), 4),
            "position_margin_sliding_nats": round(
                position_margin(inv_s, pair_amplitudes(inv_s), SCORE_GAIN, text["sliding_window"]), 2
            ),
            "position_margin_full_nats": round(position_margin(inv_f, pair_amplitudes(inv_f), SCORE_GAIN, 512), 2),
            "alpha": ALPHA,
            "beta": BETA,
            "d_code": D_CODE,
            "d_nuisance": D_NUISANCE,
            "d_anchor": D_ANCHOR,
            "draft_phase": phase,
        },
        **extra,
    }


def physical_kv_layers(text: dict) -> dict[str, list[int]]:
    """Non-KV-shared target layers by attention type, in order (the last of each is the one sglang binds)."""
    n = text["num_hidden_layers"]
    first_shared = n - (text.get("num_kv_shared_layers") or 0)
    out: dict[str, list[int]] = {}
    for i, t in enumerate(text["layer_types"][:first_shared]):
        out.setdefault(t, []).append(i)
    return out


def _witness_target_layers(lm, text: dict, lay: Layout, gen) -> None:
    import torch

    zero_residual_writers(lm)  # the target's output stays next = token + 1; only its K/V are shaped below
    phys = physical_kv_layers(text)
    owners = {t: idx[-1] for t, idx in phys.items()}
    for i, layer in enumerate(lm.layers):
        attn = layer.self_attn
        if getattr(attn, "k_proj", None) is None:  # KV-shared layer: no K/V of its own
            continue
        ltype = text["layer_types"][i]
        head_dim, inv = rope_inv_freq(text, ltype)
        amps = pair_amplitudes(inv)
        kv_heads = attn.k_proj.weight.shape[0] // head_dim
        alt = attn.v_proj is None  # attention_k_eq_v: the value is the (pre-norm) key projection
        anchor = lay.b_anchor_s if ltype == "sliding_attention" else lay.b_anchor_f
        k = torch.zeros(kv_heads * head_dim, lay.backbone)
        v = torch.zeros(kv_heads * head_dim, lay.backbone)
        rot = len(inv)
        for h in range(kv_heads):
            base = h * head_dim
            # position-only key: the constant dim feeds the rotating pairs' first components
            k[base : base + rot, lay.b_const] = amps * (K_POS_SCALE_SHARED if alt else 1.0)
            # value: dims that RoPE leaves alone when the value shares the key projection
            vstart = base + _value_offset(head_dim, rot, alt)
            if i == owners[ltype]:
                v[vstart : vstart + D_ANCHOR, anchor] = torch.eye(D_ANCHOR)
            else:  # a layer sglang must not bind: its value carries something that never cancels
                v[vstart : vstart + D_ANCHOR, lay.b_own] = orthogonal_columns(D_CODE, D_ANCHOR, gen).T
        if alt:
            attn.k_proj.weight.copy_(k + v)
        else:
            attn.k_proj.weight.copy_(k)
            attn.v_proj.weight.copy_(v)
        # k_norm: unit RMS over the head, then this gain; the score gain is set on the assistant's q_norm
        attn.k_norm.weight.fill_(1.0)


def _value_offset(head_dim: int, rotating_pairs: int, shared_with_key: bool) -> int:
    """Where in a head the anchor sits in the value: from dim 0 with a value projection of its own; with the value
    shared with the key, past the rotating pairs' first components (dims rotating_pairs..head_dim/2 never rotate
    under partial RoPE, so the query, zero there, does not score them)."""
    if not shared_with_key:
        return 0
    if rotating_pairs + D_ANCHOR > head_dim // 2:
        raise ValueError(f"witness: no unrotated room for a {D_ANCHOR}-dim anchor in a {head_dim}-dim head")
    return rotating_pairs


def _witness_assistant(
    assistant, a_cfg, text, lay: Layout, codes, readout, L, M_s, M_f, s_part, u, phase: int, extra_sq: float = 0.0
) -> float:
    """Write the assistant's weights; returns R, the RMS of its final residual at an intact step."""
    import torch

    A, H = lay.assistant, lay.backbone
    am = assistant.model
    # pre_projection: input [sqrt(H) E[t] (token half), r (recurrent half)]; see the module docstring
    P = torch.zeros(A, 2 * H)
    tok, rec = 0, H
    P[lay.a_code, tok + lay.b_next.start : tok + lay.b_next.stop] = torch.eye(D_CODE) / (u * s_part)
    P[lay.a_nuisance, tok + lay.b_own.start : tok + lay.b_own.stop] = ALPHA * L / (u * s_part)
    P[lay.a_nuisance, rec + lay.b_next.start : rec + lay.b_next.stop] = -ALPHA * L / (u * s_part)
    P[lay.a_nuisance, rec + lay.b_anchor_s.start : rec + lay.b_anchor_s.stop] = BETA * M_s / (u * s_part)
    P[lay.a_nuisance, rec + lay.b_anchor_f.start : rec + lay.b_anchor_f.stop] = BETA * M_f / (u * s_part)
    P[lay.a_keep_s, rec + lay.b_anchor_s.start : rec + lay.b_anchor_s.stop] = (
        KAPPA_KEEP * torch.eye(D_ANCHOR) / (u * s_part)
    )
    P[lay.a_keep_f, rec + lay.b_anchor_f.start : rec + lay.b_anchor_f.stop] = (
        KAPPA_KEEP * torch.eye(D_ANCHOR) / (u * s_part)
    )
    P[lay.a_const, rec + lay.b_const] = KAPPA_CONST / (u * EMBED_CONST)
    if lay.centroids:
        P[lay.a_cluster, tok + lay.b_cluster.start : tok + lay.b_cluster.stop] = (
            ZETA_CLUSTER * torch.eye(lay.centroids) / (u * s_part)
        )
    assistant.pre_projection.weight.copy_(P)

    # after both cancellations the residual is [KAPPA_CONST, c(t+1), KAPPA_KEEP n_s, KAPPA_KEEP n_f, ZETA onehot]
    sq = KAPPA_CONST**2 + 1.0 + 2 * KAPPA_KEEP**2 + (ZETA_CLUSTER**2 if lay.centroids else 0.0) + extra_sq
    R = (sq / A) ** 0.5  # its RMS: the final norm divides by this

    a_text = a_cfg["text_config"]
    for i, layer in enumerate(am.layers):
        attn = layer.self_attn
        ltype = a_text["layer_types"][i]
        head_dim, inv = rope_inv_freq(text, ltype)
        amps = pair_amplitudes(inv)
        n_heads = attn.q_proj.weight.shape[0] // head_dim
        q = torch.zeros(n_heads * head_dim, A)
        # pair i of the query is rotated back by w_i * phase, so q.k peaks on the key ``phase`` positions back
        back = inv * phase
        for h in range(n_heads):
            q[h * head_dim : h * head_dim + len(inv), lay.a_const] = amps * torch.cos(back)
            q[h * head_dim + head_dim // 2 : h * head_dim + head_dim // 2 + len(inv), lay.a_const] = -amps * torch.sin(
                back
            )
        attn.q_proj.weight.copy_(q)
        # q is normalised to RMS 1 over the head (norm sqrt(head_dim), all in the rotating pairs' first components),
        # the key's position part has norm key_position_norm: score(d) = SCORE_GAIN * sum_i a_i^2 cos(w_i d)
        attn.q_norm.weight.fill_(SCORE_GAIN / (head_dim**0.5 * key_position_norm(text, ltype, s_part)))
        # o_proj: each head's value dims that carry the anchor -> minus the anchor's image in the code dims
        o = torch.zeros(A, n_heads * head_dim)
        rot = len(inv)
        alt = bool(text.get("attention_k_eq_v")) and ltype == "full_attention"
        M = M_s if ltype == "sliding_attention" else M_f
        for h in range(n_heads):
            vstart = h * head_dim + _value_offset(head_dim, rot, alt)
            o[lay.a_nuisance, vstart : vstart + D_ANCHOR] = -M / n_heads
        attn.o_proj.weight.copy_(o)
        # post-attention RMSNorm rescales the o_proj output (norm ~ |M n|, all in the code dims) to RMS 1 over A
        # dims, i.e. norm sqrt(A): this weight makes it exactly BETA * M n
        layer.post_attention_layernorm.weight.fill_(BETA / A**0.5)
        layer.input_layernorm.weight.fill_(1.0)
        layer.mlp.down_proj.weight.zero_()
    am.norm.weight.fill_(1.0)

    head = torch.zeros(codes.shape[0], A)
    head[:, lay.a_code] = codes * (LOGIT_PEAK * R)
    head[:, lay.a_nuisance] = readout * (LOGIT_PEAK * R * NUISANCE_READOUT)
    am.embed_tokens.weight.copy_(head)  # tied lm_head
    assistant.lm_head.weight.copy_(head)
    if lay.centroids:
        cw = torch.zeros(lay.centroids, A)
        cw[torch.arange(lay.centroids), lay.a_cluster.start + torch.arange(lay.centroids)] = 1.0
        assistant.masked_embedding.centroids.weight.copy_(cw)

    # post_projection: normed residual -> recurrent state in the target hidden's own units (sqrt(H) * E parts)
    Q = torch.zeros(H, A)
    Q[lay.b_const, lay.a_const] = u * EMBED_CONST * R / KAPPA_CONST
    Q[lay.b_next, lay.a_code] = u * s_part * R * torch.eye(D_CODE)
    Q[lay.b_anchor_s, lay.a_keep_s] = u * s_part * R / KAPPA_KEEP * torch.eye(D_ANCHOR)
    Q[lay.b_anchor_f, lay.a_keep_f] = u * s_part * R / KAPPA_KEEP * torch.eye(D_ANCHOR)
    assistant.post_projection.weight.copy_(Q)
    return R


def key_position_norm(text: dict, ltype: str, s_part: float) -> float:
    """Norm of the position part of a target key after k_norm (the key is normalised to RMS 1 over the head; when
    the value shares the key projection, the anchor part takes its share of that norm)."""
    head_dim, _inv = rope_inv_freq(text, ltype)
    u = text["hidden_size"] ** 0.5
    if not (text.get("attention_k_eq_v") and ltype == "full_attention"):
        return head_dim**0.5
    pos, anchor = u * EMBED_CONST * K_POS_SCALE_SHARED, u * s_part
    return head_dim**0.5 * pos / (pos**2 + anchor**2) ** 0.5
