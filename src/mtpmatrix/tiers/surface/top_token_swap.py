"""A custom logit processor for sglang (``custom_logit_processor`` of a /generate request), as a user writes one: in
each logits row whose top token is ``custom_params["token_id"]``, that token's logit and the logit of
``custom_params["instead"]`` trade places. The row then picks ``instead`` by the margin the row gave ``token_id``.

Why a swap, and why only where the token is on top:
  * it is a function of the row's own logits, never of the request's position or history, so applying it to each
    verify row is the same as applying it once per decode step: a greedy output with it is exact with and without
    MTP (a processor that reads ``__req__.output_ids`` has no such meaning under verify, where one request has many
    rows at different depths);
  * on the witness (next = token + 1, the top 7.66 nats clear) it changes exactly one step of the chain:
    ``instead`` wins by 7.66 nats where ``token_id`` would have, and the chain goes on from ``instead``;
  * the values stay finite (no -inf), so the logprobs a request returns stay plain numbers.

How sglang runs it (0.5.13, 0.5.17, 0.5.23, ``srt/sampling/custom_logit_processor.py``): the string is
``json.dumps({"callable": dill.dumps(cls).hex()})``; the scheduler turns it back with ``dill.loads`` and calls the
result with no arguments (``CustomLogitProcessor.from_str``), then calls that with ``(logits, custom_param_list)``
and writes the returned rows back. dill pickles a class of an importable module by reference (module and name), so
the scheduler imports this module: it must import without torch or sglang (the logits arrive as a torch tensor, and
only tensor methods are used; numpy arrays take the same calls, which the unit tests use). A class pickled by
reference is the same bytes from the standard library's pickle, so building the string needs no sglang and no dill.

Rows per params entry: the sampler passes one row per request; 0.5.13's speculative verify passes each request's
``draft_token_num`` rows (consecutive) with one params entry per request (``layers/sampler.py:
apply_custom_logit_processor``, ``torch.repeat_interleave(batch_mask, num_tokens_in_batch)`` with the params list
unrepeated), 0.5.23 one entry per row (the list repeated per token). Each entry here covers ``rows // entries``
consecutive rows, which reads both layouts right.
"""

from __future__ import annotations

import json
import pickle

# dill's default protocol is pickle's (dill.settings["protocol"] = DEFAULT_PROTOCOL); any protocol loads.
_PROTOCOL = 4


class TopTokenSwap:
    """sglang custom logit processor: where a row's top token is ``token_id``, ``token_id`` and ``instead`` swap
    logits (``custom_params``: ``{"token_id": int, "instead": int}``)."""

    def __call__(self, logits, custom_param_list=None):
        if not custom_param_list:
            return logits
        rows, entries = logits.shape[0], len(custom_param_list)
        if rows % entries:  # neither sglang layout: fail loudly (the server log names it) rather than guess
            raise ValueError(f"TopTokenSwap: {rows} logit rows for {entries} custom_params entries")
        per_entry = rows // entries
        top = logits.argmax(-1)
        for i, params in enumerate(custom_param_list):
            if not params or "token_id" not in params:
                continue
            token, instead = int(params["token_id"]), int(params["instead"])
            block = logits[i * per_entry : (i + 1) * per_entry]  # a view: edits land in ``logits``
            hit = top[i * per_entry : (i + 1) * per_entry] == token
            was = block[hit, token]  # advanced indexing: a copy
            block[hit, token] = block[hit, instead]
            block[hit, instead] = was
        return logits


def serialised() -> str:
    """The ``custom_logit_processor`` string of a request: what ``CustomLogitProcessor.to_str()`` gives for this
    class (dill pickles it by reference, the bytes the standard pickle writes)."""
    return json.dumps({"callable": pickle.dumps(TopTokenSwap, protocol=_PROTOCOL).hex()})


def custom_params(token_id: int, instead: int) -> dict:
    return {"token_id": token_id, "instead": instead}
