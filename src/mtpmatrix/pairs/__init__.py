"""Tiny Gemma 4 target/assistant pairs built on the fly (no real weights), one module per kind of pair.

- ``tiny``: the pair families (e-series, moe-26b-a4b, dense-31b), random and constructed ("+1") weights, the build
  cache and its marker;
- ``witness``: the witness construction (drafts right only when every Frozen-KV hand-off is right);
- ``witness_harness``: drafting with a witness on CPU (the reference tier's ablations);
- ``decoy``: the decoy witness (a wrong draft ranked first at known inputs) and its exact accept-length prediction;
- ``sampled``: the sampled pair (a closed-form next-token distribution) and its lossless-in-distribution checks, a
  package (ring, bonus, structure, verify_model, weights, trimmed_target: its docstring says what each holds);
- ``weights``: weight-writing helpers every constructed pair shares.
"""
