"""Long witness weights: the construction of the pair whose rule ``pairs/long_witness.py`` states.

Construction (every layer other than those two writes nothing to the residual stream; dims of the target hidden:
``BACKBONE``)
------------------------------------------------------------------------------------------------------------------
Embedding row E[t]: a constant c0 (the same in every row), the one-hot of its member (null for non-body tokens),
a key flag (key tokens) and the one-hot of its own group (null for non-key tokens), scaled so |E[t]|^2 = 1/2.
Sliding owner layer: key = the constant through k_proj into the rotating pairs' first components, amplitudes
``witness.positions.pair_amplitudes`` (position-only after k_norm, norm sqrt(head_dim)); value = the member one-hot (v_norm:
sqrt(head_dim) in one slot); query = lambda * peak(W - 1) + TRAP_WEIGHT * lambda * peak(W) (a witness peak is the
query whose score at offset d is sum_i a_i^2 cos(w_i (d - offset))), unit-normalised, q_norm weight so that its
score is TARGET_SCORE_GAIN times the unit score; o_proj sends value slot m to "next member" dim succ(m).
Full owner layer: key = FLAG_K times the flag in an unrotated dim (plus the group one-hot when the value shares the
key projection); value = the group one-hot; query = the constant into the flag dim, q_norm weight such that the
key token scores FULL_SCORE nats, every other token 0; o_proj sends group slot g to "next group" dim g.
Both post-attention norms have weight WRITE_W: each layer adds a one-hot of norm WRITE_W sqrt(H), whatever mixture
its attention read, so the final residual has RMS exactly 1 (1/2 + 1/4 + 1/4: the final norm is the identity and
sglang's pre-norm and post-norm hidden states agree). The head scores body_token(g, m) HALF_LOGIT for the next-group
dim g plus HALF_LOGIT for the next-member dim m: the right token 24, a token right in one half 12, every other 0.
The other physical layers keep position-only / flag keys but carry a deranged member / group in their values
(``DERANGE``), so a drafter bound to one of them reads another token.

Drafter: its state carries a draft counter. pre_projection: the token half's constant -> KAPPA; the recurrent half's
constant (the target's hidden state has it, a drafter state does not) -> counter slot 0; counter slot k of the
state -> slot k + 1. Sliding layer (reads the target's sliding owner KV): query = a witness peak at offset
W - 2 + phase - k from counter slot k, i.e. draft k (0-based) of a round whose last accepted token is at position
P - 1 reads position P + k - (W - 1), the token the target reads for x[P + k + 1]; value slot m -> member dim
succ(m). Full layer (reads the full owner KV): the target full layer's query. post_projection writes the counter
back. The head (and, with ordered embeddings, the centroid of group g, whose cluster holds exactly group g's body
tokens: ``token_ordering`` is written so) reads member and group as the target's. So a draft is right exactly when
its sliding read lands on the right position of the right layer's KV and its full read finds the right key: the
harness ablations (``DRAFT_ABLATIONS``) take it to ~0. It is blind to the hidden state's content beyond its
constant and to tree parents (the counter is the same at every node of a level): the witness pairs cover those.
"""

from __future__ import annotations

from mtpmatrix.pairs.long_witness import (
    BODY_BASE,
    COUNTER,
    DRAFT_SCORE_GAIN,
    FULL_SCORE,
    GROUPS,
    HALF_LOGIT,
    MEMBERS,
    NULL_GROUP,
    TARGET_SCORE_GAIN,
    body_token,
    draft_offset,
    key_group_of,
    margins,
    member_of,
    peak_query,
    succ,
    target_query,
)
from mtpmatrix.pairs.weights import zero_residual_writers
from mtpmatrix.pairs.witness.layout import physical_kv_layers
from mtpmatrix.pairs.witness.phase import REFERENCE_DRAFT_PHASE
from mtpmatrix.pairs.witness.positions import pair_amplitudes, rope_inv_freq

FLAG_K = 3.0  # the flag's weight in the full key against the group one-hot's (when the value shares the key)
EMBED_CONST = 0.4
EMBED_SQ, WRITE_W = 0.5, 0.5
KAPPA, GAMMA, OMEGA = 1.0, 1.0, 0.5  # drafter residual: constant, counter, each write's RMS
DERANGE = 3  # non-owner layers carry member + 3 / group + 3: reading them drafts another token
# target hidden (backbone) dims
B_CONST, B_MEMBER, B_FLAG, B_GROUP = 0, 1, 33, 34
B_NEXT_MEMBER, B_NEXT_GROUP, B_COUNTER = 42, 74, 82
# drafter hidden dims
A_CONST, A_COUNTER, A_MEMBER, A_GROUP = 0, 1, 9, 41
FLAG_SLOT, GROUP_SLOT = 8, 9  # in a full head: past the 8 rotating pairs' first components (partial RoPE)


def token_ordering(vocab: int, num_centroids: int, gen):
    """A token permutation whose cluster g (0-7) holds exactly group g's body tokens (the drafter's centroid head
    then picks the cluster from the group it read); the rest fill the other clusters. Shuffled within each."""
    import torch

    per = vocab // num_centroids
    if per != MEMBERS or num_centroids < GROUPS:
        raise ValueError(
            f"long witness: clusters of {per} tokens, {num_centroids} clusters; needs {MEMBERS}, >= {GROUPS}"
        )
    parts = [body_token(g, 0) + torch.randperm(MEMBERS, generator=gen) for g in range(GROUPS)]
    rest = torch.tensor([t for t in range(vocab) if t < BODY_BASE])
    parts.append(rest[torch.randperm(len(rest), generator=gen)])
    return torch.cat(parts)


def make_long_witness(target, assistant, t_cfg: dict, a_cfg: dict, gen, phase: int = REFERENCE_DRAFT_PHASE) -> dict:
    """Overwrite freshly initialised fp32 ``target`` / ``assistant`` weights with the long witness (module
    docstring), the drafter built for draft ``phase``; returns the margins for the pair's marker."""
    import torch

    text = t_cfg["text_config"]
    V, H, A = text["vocab_size"], text["hidden_size"], a_cfg["text_config"]["hidden_size"]
    if V != BODY_BASE + GROUPS * MEMBERS or H < B_COUNTER + COUNTER or A < A_GROUP + GROUPS:
        raise ValueError(f"long witness: vocab {V}, hidden {H} / {A} do not fit the layout")
    u = H**0.5
    E = torch.zeros(V, H)
    for t in range(V):
        E[t, B_MEMBER + member_of(t)] = 1.0
        g = key_group_of(t)
        E[t, B_GROUP + (NULL_GROUP if g is None else g)] = 1.0
        if g is not None:
            E[t, B_FLAG] = 1.0
    E = E / E.norm(dim=1, keepdim=True) * (EMBED_SQ - EMBED_CONST**2) ** 0.5
    E[:, B_CONST] = EMBED_CONST
    lm = target.model.language_model
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(E)
        zero_residual_writers(lm)
        lm.norm.weight.fill_(1.0)
        head = torch.zeros(V, H)
        for g in range(GROUPS):
            for m in range(MEMBERS):
                head[body_token(g, m), B_NEXT_MEMBER + m] = head[body_token(g, m), B_NEXT_GROUP + g] = HALF_LOGIT / (
                    WRITE_W * u
                )
        target.lm_head.weight.copy_(head)
        _target_layers(lm, text, u)
        _drafter(assistant, a_cfg, text, phase, u, gen)
    return {"long_witness": margins(text, phase)}


def _full_key_flag(text: dict) -> float:
    """The key token's flag entry after k_norm (the rest of its head: the group one-hot when k_eq_v)."""
    hd, _inv = rope_inv_freq(text, "full_attention")
    if text.get("attention_k_eq_v"):
        return hd**0.5 * FLAG_K / (FLAG_K**2 + 1.0) ** 0.5
    return hd**0.5


def _target_layers(lm, text: dict, u: float) -> None:
    import torch

    phys = physical_kv_layers(text)
    owners = {t: idx[-1] for t, idx in phys.items()}
    _inv, amps, alpha, beta = target_query(text)
    for i, layer in enumerate(lm.layers):
        attn = layer.self_attn
        if getattr(attn, "k_proj", None) is None:  # KV-shared: reads the owner's KV, writes nothing
            continue
        ltype = text["layer_types"][i]
        hd, inv = rope_inv_freq(text, ltype)
        kv_heads = attn.k_proj.weight.shape[0] // hd
        q_heads = attn.q_proj.weight.shape[0] // hd
        owner = i == owners[ltype]
        shift = 0 if owner else DERANGE
        k = torch.zeros(kv_heads * hd, lm.config.hidden_size)
        v = torch.zeros_like(k)
        q = torch.zeros(q_heads * hd, lm.config.hidden_size)
        o = torch.zeros(lm.config.hidden_size, q_heads * hd)
        rot = len(inv)
        for h in range(kv_heads):
            base = h * hd
            if ltype == "sliding_attention":
                k[base : base + rot, B_CONST] = amps
                for m in range(MEMBERS):
                    v[base + (m + shift) % MEMBERS, B_MEMBER + m] = 1.0
            else:
                k[base + FLAG_SLOT, B_FLAG] = FLAG_K
                for g in range(GROUPS):
                    v[base + GROUP_SLOT + (g + shift) % GROUPS, B_GROUP + g] = 1.0
        for h in range(q_heads):
            _reading_head(q, o, h * hd, hd, ltype, [(B_CONST, alpha, beta)], B_CONST, (B_NEXT_MEMBER, B_NEXT_GROUP))
        if attn.v_proj is None:  # attention_k_eq_v: the value is the key projection before k_norm
            attn.k_proj.weight.copy_(k + v)
        else:
            attn.k_proj.weight.copy_(k)
            attn.v_proj.weight.copy_(v)
        attn.q_proj.weight.copy_(q)
        attn.k_norm.weight.fill_(1.0)
        gain = TARGET_SCORE_GAIN / hd if ltype == "sliding_attention" else FULL_SCORE / (hd**0.5 * _full_key_flag(text))
        attn.q_norm.weight.fill_(gain)
        layer.input_layernorm.weight.fill_(1.0)
        if owner:
            attn.o_proj.weight.copy_(o)
            layer.post_attention_layernorm.weight.fill_(WRITE_W)


def _reading_head(q, o, base: int, hd: int, ltype: str, queries, const: int, out: tuple[int, int]) -> None:
    """One query head (from dim ``base``) of a layer that reads what the target and the drafter read: a sliding head
    takes each (column, alpha, beta) of ``queries`` into its rotating pairs and sends value slot m to member dim
    ``out[0]`` + succ(m); a full head takes the constant column ``const`` into the flag slot and sends group slot g to
    group dim ``out[1]`` + g. Every head of a layer reads the same, so each writes 1 / heads of it."""
    heads = q.shape[0] // hd
    if ltype == "sliding_attention":
        for col, a, b in queries:
            q[base : base + len(a), col] = a.float()
            q[base + hd // 2 : base + hd // 2 + len(b), col] = b.float()
        for m in range(MEMBERS):
            o[out[0] + succ(m), base + m] = 1.0 / heads
    else:
        q[base + FLAG_SLOT, const] = 1.0
        for g in range(GROUPS):
            o[out[1] + g, base + GROUP_SLOT + g] = 1.0 / heads


def _drafter(assistant, a_cfg: dict, text: dict, phase: int, u: float, gen) -> None:
    import torch

    a_text = a_cfg["text_config"]
    A, H, V = a_text["hidden_size"], text["hidden_size"], text["vocab_size"]
    w = text["sliding_window"]
    am = assistant.model
    zero_residual_writers(am)
    P = torch.zeros(A, 2 * H)
    P[A_CONST, B_CONST] = KAPPA / (u * EMBED_CONST)  # token half: the target's scaled embedding
    P[A_COUNTER, H + B_CONST] = GAMMA / (u * EMBED_CONST)  # the target's hidden state (RMS 1, so pre = post norm)
    for k in range(COUNTER - 1):
        P[A_COUNTER + k + 1, H + B_COUNTER + k] = 1.0
    assistant.pre_projection.weight.copy_(P)
    for i, layer in enumerate(am.layers):
        attn = layer.self_attn
        ltype = a_text["layer_types"][i]
        hd, inv = rope_inv_freq(text, ltype)
        heads = attn.q_proj.weight.shape[0] // hd
        q = torch.zeros(heads * hd, A)
        o = torch.zeros(A, heads * hd)
        queries = []  # counter slot k -> a unit query peaked where draft k reads (sliding layers only)
        for k in range(COUNTER if ltype == "sliding_attention" else 0):
            a, b = peak_query(inv, pair_amplitudes(inv), draft_offset(w, phase, k))
            n = (a.square().sum() + b.square().sum()).sqrt()
            queries.append((A_COUNTER + k, a / n, b / n))
        for h in range(heads):
            _reading_head(q, o, h * hd, hd, ltype, queries, A_CONST, (A_MEMBER, A_GROUP))
        attn.q_proj.weight.copy_(q)
        attn.o_proj.weight.copy_(o)
        gain = DRAFT_SCORE_GAIN / hd if ltype == "sliding_attention" else FULL_SCORE / (hd**0.5 * _full_key_flag(text))
        attn.q_norm.weight.fill_(gain)
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(OMEGA)
    am.norm.weight.fill_(1.0)
    R = ((KAPPA**2 + GAMMA**2 + 2 * OMEGA**2 * A) / A) ** 0.5  # the final residual's RMS at every step
    head = torch.zeros(V, A)
    for g in range(GROUPS):
        for m in range(MEMBERS):
            head[body_token(g, m), A_MEMBER + m] = head[body_token(g, m), A_GROUP + g] = (
                HALF_LOGIT * R / (OMEGA * A**0.5)
            )
    am.embed_tokens.weight.copy_(head)  # tied lm_head
    assistant.lm_head.weight.copy_(head)
    if assistant.masked_embedding is not None:
        C = a_cfg["num_centroids"]
        assistant.masked_embedding.token_ordering.copy_(token_ordering(V, C, gen))
        cw = torch.zeros(C, A)
        cw[torch.arange(GROUPS), A_GROUP + torch.arange(GROUPS)] = 1.0
        assistant.masked_embedding.centroids.weight.copy_(cw)
    Q = torch.zeros(H, A)
    for k in range(COUNTER):
        Q[B_COUNTER + k, A_COUNTER + k] = R  # the normed counter GAMMA / R back to GAMMA
    assistant.post_projection.weight.copy_(Q)
