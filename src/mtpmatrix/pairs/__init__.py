"""Tiny Gemma 4 target/assistant pairs built on the fly (no real weights): the shape every pair shares, then one
module or package per kind of pair.

- ``tiny``: the pair families' config templates (e-series, moe-26b-a4b, dense-31b), the vocabulary and tokenizer,
  the checkpoint written per variant, the build cache and its marker (a package: its docstring says what each
  module holds);
- ``plus_one``: the constructed pair (next = token + 1 from the token embedding alone);
- ``witness``: the witness (drafts right only when every Frozen-KV hand-off is right) and drafting with it on CPU
  (the reference tier's ablations), a package (weights, layout, codes, positions, phase, harness);
- ``decoy``: the decoy witness (a wrong draft ranked first at known inputs) and its exact accept-length prediction;
- ``sampled``: the sampled pair (a closed-form next-token distribution) and its lossless-in-distribution checks, a
  package (ring, bonus, structure, verify_model, weights, trimmed_target: its docstring says what each holds);
- ``long_witness``: attention past the sliding window decides the next token;
- ``weights``: weight-writing helpers every constructed pair shares.
"""
