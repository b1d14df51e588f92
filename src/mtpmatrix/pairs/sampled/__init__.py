"""The sampled pair: a tiny target whose next-token law is known in closed form, so sampled (T > 0) speculative
decoding can be held to it. A module per part:

- ``ring``: the first region (the ring): its closed-form law, the request plan, the pooled chi-square check;
- ``bonus``: the second region (chains drafted exactly, so every 6th token is a bonus token sampled at T > 0 from a
  closed form) and its check;
- ``structure``: the per-group, per-position, transition, verify-depth and first-token tests beside the pooled one;
- ``verify_model``: a CPU model of sglang's sampled verify on this pair, intact or broken (the checks' power);
- ``weights``: both regions written into a freshly initialised target and assistant (``make_sampled``);
- ``trimmed_target``: the target with only the layers anything reads, for transformers' sampling checks.
"""
