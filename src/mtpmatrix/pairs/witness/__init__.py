"""The witness pairs: a tiny Gemma 4 target + assistant whose drafts are right only when sglang's Frozen-KV MTP path
hands the assistant every input it is supposed to. A module per part:

- ``weights``: the construction (its docstring holds the why and the arithmetic) and ``make_witness``, which writes
  it into a freshly initialised target and assistant;
- ``layout``: which dims of the target and assistant hidden states hold what, and which target layers own KV;
- ``codes``: the token codes (a spread-out spherical code) and random orthonormal maps;
- ``positions``: the RoPE geometry of the position-only query and key, and its margins;
- ``phase``: the draft phase (the witness's one free convention) by sglang release;
- ``harness``: drafting with a witness on CPU, intact or with one hand-off broken (the reference tier's ablations).
"""
