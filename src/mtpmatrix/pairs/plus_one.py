"""The constructed pair: weights that make both models compute "next token = current token + 1 (mod vocab)".

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
"""

from __future__ import annotations

from mtpmatrix.pairs.tiny.configs import ASSISTANT_HIDDEN
from mtpmatrix.pairs.tiny.vocab import VOCAB
from mtpmatrix.pairs.weights import centroid_cluster_of, write_target_head, zero_residual_writers


def make_plus_one(target, assistant, a_cfg: dict, gen) -> None:
    """Overwrite the weights of freshly initialised fp32 ``target`` / ``assistant`` with the +1 rule."""
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
