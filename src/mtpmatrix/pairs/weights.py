"""Weight-writing helpers the constructed pairs share (tiny's constructed pair, the witness and decoy, the sampled
pair): each pair writes its rule into randomly initialised Gemma 4 weights with these."""

from __future__ import annotations


def zero_residual_writers(text_model) -> None:
    """Every decoder layer of ``text_model`` adds nothing to the residual stream."""
    for layer in text_model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        if getattr(layer, "per_layer_projection", None) is not None:
            layer.per_layer_projection.weight.zero_()
        if getattr(layer, "experts", None) is not None:
            layer.experts.down_proj.zero_()


def write_target_head(target, embed, head, pair: str) -> None:
    """The target half every constructed pair shares: token embedding ``embed``, output head ``head`` (the pair
    needs them untied: the head carries the rule, the embedding the token), no layer writing to the residual stream,
    and a final norm of weight 1, so the head reads the scaled embedding of the current token unchanged."""
    lm = target.model.language_model
    lm.embed_tokens.weight.copy_(embed)
    assert target.lm_head.weight.data_ptr() != lm.embed_tokens.weight.data_ptr(), f"{pair} target must be untied"
    target.lm_head.weight.copy_(head)
    zero_residual_writers(lm)
    lm.norm.weight.fill_(1.0)


def centroid_cluster_of(assistant, vocab: int, num_centroids: int):
    """token -> the centroid cluster holding it, for an assistant with ordered embeddings (its ``token_ordering``
    permutation cut into ``num_centroids`` clusters of vocab // num_centroids tokens)."""
    import torch

    ordering = assistant.masked_embedding.token_ordering.long()
    cluster_of = torch.empty(vocab, dtype=torch.long)
    cluster_of[ordering] = torch.arange(vocab) // (vocab // num_centroids)
    return cluster_of
