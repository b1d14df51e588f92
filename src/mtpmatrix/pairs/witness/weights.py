"""The witness construction: a tiny Gemma 4 target + assistant whose drafts are right only when sglang's Frozen-KV
MTP path hands the assistant every input it is supposed to (``make_witness`` writes it).

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
DxD matrix, M_s, M_f embed D_ANCHOR dims isometrically into D dims (``Draws``; dims: ``layout.Layout``).

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
        position (see ``witness.phase``): the last accepted token's, so it reads that token's value
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
dims, so the draft lands on an unrelated token: the ablations of ``witness.harness.draft_rounds`` drop the accepted
drafts per round from ~5 of 5 to ~0.

Position selection (``witness.positions``): query and key use the same per-pair RoPE amplitudes, so the score at
relative offset d is G * sum_i a_i cos(w_i (d - phase)); it peaks at d = phase and the next best offset is at least
``position_margin`` nats lower (printed in the pair's marker; > 10 nats, so the neighbours carry < 1e-4 of the
attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtpmatrix.pairs.weights import centroid_cluster_of, zero_residual_writers
from mtpmatrix.pairs.witness.codes import code_margin, orthogonal_columns, spherical_code
from mtpmatrix.pairs.witness.layout import D_ANCHOR, D_CODE, D_NUISANCE, Layout, physical_kv_layers
from mtpmatrix.pairs.witness.phase import REFERENCE_DRAFT_PHASE
from mtpmatrix.pairs.witness.positions import pair_amplitudes, position_margin, rope_inv_freq

NUISANCE_READOUT = 1.0  # how strongly the output head reads the nuisance dims (see the module docstring)
ALPHA = 4.0
BETA = 4.0
LOGIT_PEAK = 20.0  # target and assistant logits at the argmax (below the 30.0 softcap)
SCORE_GAIN = (
    112.0  # attention score at the peak offset: margins of ~20 (sliding) / ~15 (full) nats, see position_margin
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


@dataclass(frozen=True)
class Draws:
    """The construction's random draws (module docstring), taken from the generator in this order."""

    codes: Any  # [vocab, D_CODE]: c(t)
    anchor_s: Any  # [vocab, D_ANCHOR]: n_s(t)
    anchor_f: Any  # [vocab, D_ANCHOR]: n_f(t)
    L: Any  # [D_NUISANCE, D_CODE], orthogonal
    M_s: Any  # [D_NUISANCE, D_ANCHOR], orthonormal columns
    M_f: Any
    readout: Any  # [vocab, D_NUISANCE]: how each token's head row reads the nuisance dims (unit rows)

    @classmethod
    def take(cls, vocab: int, gen) -> Draws:
        import torch

        codes = spherical_code(vocab, D_CODE, gen)
        anchor_s = torch.randn(vocab, D_ANCHOR, generator=gen)
        anchor_s = anchor_s / anchor_s.norm(dim=1, keepdim=True)
        anchor_f = torch.randn(vocab, D_ANCHOR, generator=gen)
        anchor_f = anchor_f / anchor_f.norm(dim=1, keepdim=True)
        L = (
            orthogonal_columns(D_NUISANCE, D_CODE, gen)
            if D_NUISANCE >= D_CODE
            else orthogonal_columns(D_CODE, D_NUISANCE, gen).T
        )
        M_s = orthogonal_columns(D_NUISANCE, D_ANCHOR, gen)
        M_f = orthogonal_columns(D_NUISANCE, D_ANCHOR, gen)
        readout = torch.randn(vocab, D_NUISANCE, generator=gen)
        readout = readout / readout.norm(dim=1, keepdim=True)
        return cls(codes, anchor_s, anchor_f, L, M_s, M_f, readout)


@dataclass(frozen=True)
class Witness:
    """One witness being built: what every step of the construction reads."""

    lay: Layout
    draws: Draws
    u: float  # sqrt(H): the target's embedding scale
    s_part: float  # each code part's share of a unit embedding row
    phase: int  # the draft phase the assistant is built for (witness.phase)
    extra_sq: float  # squared norm an extension adds to the assistant residual at every intact step


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
    lay = Layout(
        backbone=text["hidden_size"],
        assistant=a_cfg["text_config"]["hidden_size"],
        centroids=a_cfg["num_centroids"] if a_cfg.get("use_ordered_embeddings") else 0,
        extra_backbone=tuple(getattr(extension, "backbone_parts", ())),
        extra_assistant=tuple(getattr(extension, "assistant_parts", ())),
    )
    lay.check()
    parts = 4 + (1 if lay.centroids else 0) + (extension.embed_parts if extension else 0)
    w = Witness(
        lay=lay,
        draws=Draws.take(text["vocab_size"], gen),
        u=text["hidden_size"] ** 0.5,
        s_part=((1.0 - EMBED_CONST**2) / parts) ** 0.5,
        phase=phase,
        extra_sq=extension.extra_sq if extension else 0.0,
    )
    E, ctx = _target_embedding(w, assistant, gen, extension)

    lm = target.model.language_model
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(E)
        head = torch.zeros(E.shape[0], lay.backbone)
        head[:, lay.b_next] = w.draws.codes * (LOGIT_PEAK / (w.u * w.s_part))
        target.lm_head.weight.copy_(head)
        lm.norm.weight.fill_(1.0)
        _witness_target_layers(lm, text, lay, gen)
        ctx["R"] = _witness_assistant(assistant, a_cfg, text, w)
        extra = extension.apply(target, assistant, ctx) if extension else {}
    return {"witness": _margins(text, w), **extra}


def _target_embedding(w: Witness, assistant, gen, extension) -> tuple[Any, dict]:
    """The target's embedding rows (constant, own code, next code, anchors, cluster of t+1 for the centroid head,
    then the extension's parts), unit norm; and the context an extension reads."""
    import torch

    lay, d, s_part = w.lay, w.draws, w.s_part
    V = d.codes.shape[0]
    nxt = (torch.arange(V) + 1) % V
    E = torch.zeros(V, lay.backbone)
    E[:, lay.b_const] = EMBED_CONST
    E[:, lay.b_own] = s_part * d.codes
    E[:, lay.b_next] = s_part * d.codes[nxt]
    E[:, lay.b_anchor_s] = s_part * d.anchor_s
    E[:, lay.b_anchor_f] = s_part * d.anchor_f
    cluster_of = None
    if lay.centroids:
        cluster_of = centroid_cluster_of(assistant, V, lay.centroids)
        E[torch.arange(V), lay.b_cluster.start + cluster_of[nxt]] = s_part
    ctx = {"lay": lay, "s_part": s_part, "u": w.u, "codes": d.codes, "cluster_of": cluster_of, "gen": gen}
    if extension:
        extension.embed(E, ctx)
    return E / E.norm(dim=1, keepdim=True), ctx


def _margins(text: dict, w: Witness) -> dict:
    """The margins the construction relies on, and its sizes, for the pair's marker."""
    _h_dim_s, inv_s = rope_inv_freq(text, "sliding_attention")
    _h_dim_f, inv_f = rope_inv_freq(text, "full_attention")
    return {
        "code_margin": round(code_margin(w.draws.codes), 4),
        "position_margin_sliding_nats": round(
            position_margin(inv_s, pair_amplitudes(inv_s), SCORE_GAIN, text["sliding_window"]), 2
        ),
        "position_margin_full_nats": round(position_margin(inv_f, pair_amplitudes(inv_f), SCORE_GAIN, 512), 2),
        "alpha": ALPHA,
        "beta": BETA,
        "d_code": D_CODE,
        "d_nuisance": D_NUISANCE,
        "d_anchor": D_ANCHOR,
        "draft_phase": w.phase,
    }


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


def _witness_assistant(assistant, a_cfg: dict, text: dict, w: Witness) -> float:
    """Write the assistant's weights; returns R, the RMS of its final residual at an intact step."""
    lay = w.lay
    assistant.pre_projection.weight.copy_(_pre_projection(w))
    # after both cancellations the residual is [KAPPA_CONST, c(t+1), KAPPA_KEEP n_s, KAPPA_KEEP n_f, ZETA onehot]
    sq = KAPPA_CONST**2 + 1.0 + 2 * KAPPA_KEEP**2 + (ZETA_CLUSTER**2 if lay.centroids else 0.0) + w.extra_sq
    R = (sq / lay.assistant) ** 0.5  # its RMS: the final norm divides by this
    layer_types = a_cfg["text_config"]["layer_types"]
    for i, layer in enumerate(assistant.model.layers):
        _assistant_layer(layer, layer_types[i], text, w)
    assistant.model.norm.weight.fill_(1.0)
    _assistant_head(assistant, w, R)
    assistant.post_projection.weight.copy_(_post_projection(w, R))
    return R


def _pre_projection(w: Witness):
    """pre_projection: input [sqrt(H) E[t] (token half), r (recurrent half)]; see the module docstring."""
    import torch

    lay, d, us = w.lay, w.draws, w.u * w.s_part
    P = torch.zeros(lay.assistant, 2 * lay.backbone)
    tok, rec = 0, lay.backbone
    P[lay.a_code, tok + lay.b_next.start : tok + lay.b_next.stop] = torch.eye(D_CODE) / us
    P[lay.a_nuisance, tok + lay.b_own.start : tok + lay.b_own.stop] = ALPHA * d.L / us
    P[lay.a_nuisance, rec + lay.b_next.start : rec + lay.b_next.stop] = -ALPHA * d.L / us
    P[lay.a_nuisance, rec + lay.b_anchor_s.start : rec + lay.b_anchor_s.stop] = BETA * d.M_s / us
    P[lay.a_nuisance, rec + lay.b_anchor_f.start : rec + lay.b_anchor_f.stop] = BETA * d.M_f / us
    P[lay.a_keep_s, rec + lay.b_anchor_s.start : rec + lay.b_anchor_s.stop] = KAPPA_KEEP * torch.eye(D_ANCHOR) / us
    P[lay.a_keep_f, rec + lay.b_anchor_f.start : rec + lay.b_anchor_f.stop] = KAPPA_KEEP * torch.eye(D_ANCHOR) / us
    P[lay.a_const, rec + lay.b_const] = KAPPA_CONST / (w.u * EMBED_CONST)
    if lay.centroids:
        P[lay.a_cluster, tok + lay.b_cluster.start : tok + lay.b_cluster.stop] = (
            ZETA_CLUSTER * torch.eye(lay.centroids) / us
        )
    return P


def _assistant_layer(layer, ltype: str, text: dict, w: Witness) -> None:
    """One assistant layer: a position-only query at the draft phase, an o_proj that subtracts the anchor it reads
    from the code dims, nothing else written to the residual stream."""
    import torch

    lay, A = w.lay, w.lay.assistant
    attn = layer.self_attn
    head_dim, inv = rope_inv_freq(text, ltype)
    amps = pair_amplitudes(inv)
    n_heads = attn.q_proj.weight.shape[0] // head_dim
    q = torch.zeros(n_heads * head_dim, A)
    # pair i of the query is rotated back by w_i * phase, so q.k peaks on the key ``phase`` positions back
    back = inv * w.phase
    for h in range(n_heads):
        q[h * head_dim : h * head_dim + len(inv), lay.a_const] = amps * torch.cos(back)
        q[h * head_dim + head_dim // 2 : h * head_dim + head_dim // 2 + len(inv), lay.a_const] = -amps * torch.sin(back)
    attn.q_proj.weight.copy_(q)
    # q is normalised to RMS 1 over the head (norm sqrt(head_dim), all in the rotating pairs' first components),
    # the key's position part has norm key_position_norm: score(d) = SCORE_GAIN * sum_i a_i^2 cos(w_i d)
    attn.q_norm.weight.fill_(SCORE_GAIN / (head_dim**0.5 * key_position_norm(text, ltype, w.s_part)))
    # o_proj: each head's value dims that carry the anchor -> minus the anchor's image in the code dims
    o = torch.zeros(A, n_heads * head_dim)
    rot = len(inv)
    alt = bool(text.get("attention_k_eq_v")) and ltype == "full_attention"
    M = w.draws.M_s if ltype == "sliding_attention" else w.draws.M_f
    for h in range(n_heads):
        vstart = h * head_dim + _value_offset(head_dim, rot, alt)
        o[lay.a_nuisance, vstart : vstart + D_ANCHOR] = -M / n_heads
    attn.o_proj.weight.copy_(o)
    # post-attention RMSNorm rescales the o_proj output (norm ~ |M n|, all in the code dims) to RMS 1 over A
    # dims, i.e. norm sqrt(A): this weight makes it exactly BETA * M n
    layer.post_attention_layernorm.weight.fill_(BETA / A**0.5)
    layer.input_layernorm.weight.fill_(1.0)
    layer.mlp.down_proj.weight.zero_()


def _assistant_head(assistant, w: Witness, R: float) -> None:
    """The tied head reads the code dims (and, weakly, the nuisance dims); the centroid head the cluster dims."""
    import torch

    lay, d = w.lay, w.draws
    head = torch.zeros(d.codes.shape[0], lay.assistant)
    head[:, lay.a_code] = d.codes * (LOGIT_PEAK * R)
    head[:, lay.a_nuisance] = d.readout * (LOGIT_PEAK * R * NUISANCE_READOUT)
    assistant.model.embed_tokens.weight.copy_(head)  # tied lm_head
    assistant.lm_head.weight.copy_(head)
    if lay.centroids:
        cw = torch.zeros(lay.centroids, lay.assistant)
        cw[torch.arange(lay.centroids), lay.a_cluster.start + torch.arange(lay.centroids)] = 1.0
        assistant.masked_embedding.centroids.weight.copy_(cw)


def _post_projection(w: Witness, R: float):
    """post_projection: normed residual -> recurrent state in the target hidden's own units (sqrt(H) * E parts)."""
    import torch

    lay, us = w.lay, w.u * w.s_part
    Q = torch.zeros(lay.backbone, lay.assistant)
    Q[lay.b_const, lay.a_const] = w.u * EMBED_CONST * R / KAPPA_CONST
    Q[lay.b_next, lay.a_code] = us * R * torch.eye(D_CODE)
    Q[lay.b_anchor_s, lay.a_keep_s] = us * R / KAPPA_KEEP * torch.eye(D_ANCHOR)
    Q[lay.b_anchor_f, lay.a_keep_f] = us * R / KAPPA_KEEP * torch.eye(D_ANCHOR)
    return Q


def key_position_norm(text: dict, ltype: str, s_part: float) -> float:
    """Norm of the position part of a target key after k_norm (the key is normalised to RMS 1 over the head; when
    the value shares the key projection, the anchor part takes its share of that norm)."""
    head_dim, _inv = rope_inv_freq(text, ltype)
    u = text["hidden_size"] ** 0.5
    if not (text.get("attention_k_eq_v") and ltype == "full_attention"):
        return head_dim**0.5
    pos, anchor = u * EMBED_CONST * K_POS_SCALE_SHARED, u * s_part
    return head_dim**0.5 * pos / (pos**2 + anchor**2) ** 0.5
