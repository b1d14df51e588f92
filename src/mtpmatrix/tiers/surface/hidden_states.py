"""Request family "hidden_states": ``return_hidden_states`` under MTP, per request in a batch with requests that do
not ask for them, against the witness without MTP.

What sglang returns (installed sources): the server must allow it (``--enable-return-hidden-states``, 0.5.13-0.5.23;
0.5.17+ also ``--return-hidden-states-mode``; tokenizer_manager refuses the request otherwise), and
meta_info["hidden_states"] is ``Req.hidden_states``: first the prefill's rows, one per prompt token (one list:
batch_result_processor.py:_append_prefill_hidden_states, full mode), then one row per later output token. Without
MTP each decode step appends its one row; with MTP, 0.5.17+ (spec v2) appends ``accept_len`` rows per verify step
(``_append_decode_hidden_states``: rows ``i * stride .. i * stride + accept_len`` of the verify output) and 0.5.13
(spec v1) appends one row per verify step (``logits_output.hidden_states[i]``). The row of output token k is the
target's hidden state at the node that produced it, i.e. at input token output[k - 1]: what no-MTP returns.

sglang's own regression test (sgl-project/sglang test/registered/spec/eagle/test_eagle_v2_hidden_states.py,
issue #26163: EAGLE v2 at topk 1) asserts exactly this count, len(hidden_states) == completion_tokens, and nothing
of the rows' values; its OpenAI hidden-states test under EAGLE only that they are present. Here the rows are
held to no-MTP's, at topk 3 too, per request beside requests that do not ask.

So an intact server returns, for a request with P prompt tokens and n output tokens, 1 + (n - 1) entries: a
P-row block, then n - 1 rows, each the no-MTP server's row. A miscount (one row per verify step, rows past the
stop, a row missing) or a row of another node fails here. At topk > 1, 0.5.17+ moves the accepted tree path's rows
to the front of each request's block first (eagle_worker_common.py:_finalize_accept_tree_path), so the chain
slice reads the right rows. The verify step that crosses max_new_tokens appends all its accept_len rows (full
mode cuts nothing in _append_decode_hidden_states), but the output streamer sends ``hidden_states[:finished_len]``
(0.5.17 output_streamer.py l. 575-579, 0.5.23 l. 671-675; finished_len = max_new_tokens), the block plus n - 1 rows:
the count above. The request at ``BOUNDARY`` ends exactly at a verify step's end (31 = 1 + 5 x 6 tokens), where no
step crosses the limit: a release that dropped that cut would fail the other requests' count and not this one's.
Predicted deviation from the source, for the GPU run to confirm (docs/runs/2026-12-05-cpu-request-shapes-preflight.md):
0.5.13 (spec v1) appends one row per verify step, ``logits_output.hidden_states[i]`` of the verify's flattened
accepted rows (another request's row for i > 0), and its prefill advances the row offset only past requests that
ask (batch_result_processor.py l. 254-263), so an asking request prefilled after a plain one gets that one's rows;
0.5.17+ at topk 1 under the overlap scheduler may read a step's rows from the verify graph's buffer after the next
step's replay rewrote it (the draft clears batch.return_hidden_states, so the scheduler skips their copy; topk 3
gathers them into a clone first).

The block is one row per prompt token only when nothing of the prompt is in the radix cache: sglang returns the
rows it computed (0.5.17+: ``extend_input_len`` rows; 0.5.13: ``len(origin_input_ids)`` rows from the offset, past
the request's own on a hit). So no asking request shares its first token with any other request the witness
servers get (tests/unit/test_surface_request_shapes.py holds that): a prompt another family also sends, prefilled
first, would leave a 1-row block on intact sglang (the colliding start 140 of features' min-new-tokens request,
found 2026-12-05 in review, is why the third start is 145).

Tolerance, derived: the witness target's hidden state at a position is exactly sqrt(H) * E[x] (pairs/witness/weights.py:
every layer writes zero to the residual stream; E[x] has unit norm, so the final RMSNorm with weight 1 leaves it
as it is). Both servers therefore compute the same bf16 vector from the same embedding row; the only place they
may differ is the RMSNorm's reduction order (a verify batch of 6 or 12 rows against one decode row), which moves
the fp32 scale by a few fp32 ulps and so each bf16 element by at most one bf16 ulp, i.e. 2^-7 of its magnitude
(8 significand bits). Whether a release returns the state before or after that norm (both the same vector here)
adds at most one more: ROW_RTOL = 2 * 2^-7 of max(|a|, |b|) per element. A row of another token differs by O(1)
in the code dims (the codes' cross-cosine is at most 1 - 0.49, pairs/witness/codes.code_margin), far above it.
Also exact on one server alone: the witness's row depends on its input token only, so every row for input token
x (prefill or decode, any request) is the same vector within ROW_RTOL.
"""

from __future__ import annotations

from mtpmatrix.tiers.surface.logprobs import chain_prompt, position_label

NAME = "hidden_states"
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
SERVER_FLAG = "--enable-return-hidden-states"
HIDDEN = 128  # pairs.tiny.configs.TARGET_HIDDEN (kept here so the module imports without the pairs' dependencies)
MAX_NEW_TOKENS = 32
ROW_RTOL = 2 * 2.0**-7
BOUNDARY = 30  # asks for 31 tokens: the limit falls at the end of verify step 5, nothing past it
ASKING = (30, 50, 145)  # prompt starts of the requests that ask: 50's prompt rows are 30's output rows
PLAIN = (85, 195)  # the same batch's requests that do not


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR or SERVER_FLAG not in spec.mode_args:
        return []
    out = []
    for s in sorted(ASKING + PLAIN):
        limit = MAX_NEW_TOKENS - 1 if s == BOUNDARY else MAX_NEW_TOKENS
        payload: dict[str, object] = {
            "input_ids": chain_prompt(s),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": limit, "ignore_eos": True},
        }
        if s in ASKING:
            payload["return_hidden_states"] = True
        out.append((f"{'hidden' if s in ASKING else 'plain'}-{s}", payload))
    return out


def rows_of(ex) -> tuple[list[list[float]], list[list[float]]] | None:
    """(prefill rows, decode rows) of an exchange's meta_info["hidden_states"]; None when absent or not that shape."""
    hs = ex.meta.get("hidden_states")
    if not isinstance(hs, list) or not hs or not isinstance(hs[0], list) or not hs[0]:
        return None
    first = hs[0] if isinstance(hs[0][0], list) else [hs[0]]
    return first, list(hs[1:])


def row_difference(a: list[float], b: list[float]) -> tuple[int, float, float] | None:
    """(element, a, b) of the first element beyond ROW_RTOL, or None when the rows agree."""
    if len(a) != len(b):
        return (-1, float(len(a)), float(len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if abs(x - y) > ROW_RTOL * max(abs(x), abs(y)):
            return (i, x, y)
    return None


def count_problems(ex) -> list[str]:
    """One exchange's shape: no hidden states unless asked; asked: a block of one row per prompt token, then one row
    per output token after the first, each HIDDEN wide."""
    if ex.error:
        return [f"{ex.label}: request failed: {ex.error}"]
    asked = bool(ex.payload.get("return_hidden_states"))
    got = rows_of(ex)
    if not asked:
        return [f"{ex.label}: hidden states returned to a request that did not ask"] if got else []
    if got is None:
        return [f"{ex.label}: no meta_info hidden_states (asked for)"]
    prefill, decode = got
    n, p = len(ex.output_ids), len(ex.payload["input_ids"])
    out = []
    if len(prefill) != p:
        out.append(
            f"{ex.label}: prefill block of {len(prefill)} rows for {p} prompt tokens (cached_tokens "
            f"{ex.meta.get('cached_tokens')}: a radix hit leaves only the rows sglang computed)"
        )
    if len(decode) != n - 1:
        out.append(
            f"{ex.label}: {len(decode)} decode rows for {n} output tokens (expected {n - 1}: one per output token "
            f"after the prefill's; spec_verify_ct {ex.meta.get('spec_verify_ct')})"
        )
    wide = [len(r) for r in prefill + decode if len(r) != HIDDEN]
    if wide:
        out.append(f"{ex.label}: {len(wide)} rows not {HIDDEN} wide (e.g. {wide[0]})")
    return out


def predicted_rows(target) -> list[list[float]]:
    """Every input token's row, predicted: sqrt(H) * E[x] (module docstring), read from the witness target's
    checkpoint in ``target`` with torch and safetensors (the row's venv, where the smoke tier runs, has both)."""
    import math
    from pathlib import Path

    from safetensors import safe_open

    for f in sorted(Path(target).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            name = next((k for k in st.keys() if k.endswith("embed_tokens.weight") and "per_layer" not in k), None)
            if name is not None:
                table = st.get_tensor(name).float()
                if table.shape[1] != HIDDEN:
                    raise ValueError(f"{f}: {name} is {table.shape[1]} wide, the witness target {HIDDEN}")
                return (table * math.sqrt(HIDDEN)).tolist()
    raise ValueError(f"{target}: no embed_tokens weight in its safetensors")


def _row_of(row: list[float], predicted: list[list[float]]) -> int | None:
    """The input token whose predicted row ``row`` is (within ROW_RTOL), or None."""
    return next((y for y, want in enumerate(predicted) if row_difference(row, want) is None), None)


def prediction_problems(exchanges, predicted: list[list[float]]) -> list[str]:
    """Each asking exchange's rows against the prediction: prompt row i is input token prompt[i]'s, the row of output
    k + 1 is input token output[k]'s. A wrong row is named by whose row it is: consecutive rows that are consecutive
    other tokens' rows in one line, "prompt 0..11 (inputs 30..41): the rows of inputs 86..97 (+56)" (another
    request's prefill, a step read after the next one's, +6 at topk 1), any other row alone."""
    out = []
    for ex in exchanges:
        got = rows_of(ex) if ex.payload.get("return_hidden_states") and not ex.error else None
        if got is None:
            continue  # count_problems says why
        prompt, outputs = ex.payload["input_ids"], ex.output_ids
        prompt_rows = [(i, prompt[i], r) for i, r in enumerate(got[0][: len(prompt)])]
        output_rows = [(k + 1, outputs[k], r) for k, r in enumerate(got[1][: max(0, len(outputs) - 1)])]
        for name, rows in (("prompt", prompt_rows), ("output", output_rows)):
            out += _wrong_rows(f"{ex.label} {name}", rows, predicted)
    return out


def _wrong_rows(where: str, rows: list, predicted: list[list[float]]) -> list[str]:
    """The lines of ``prediction_problems`` for one section's (position, input token, row)s, in position order."""
    lines: list[str | list[tuple[int, int, int]]] = []  # a row of no token's line, or a run of other tokens' rows
    for pos, x, r in rows:
        want = predicted[x] if 0 <= x < len(predicted) else None
        diff = row_difference(r, want) if want is not None else (-1, 0.0, 0.0)
        y = None if diff is None else _row_of(r, predicted)
        if diff is None:
            lines.append("")  # a right row ends a run
        elif y is None:
            lines.append(
                f"{where} {pos} (input {x}): the row of no input token (element {diff[0]} {diff[1]:.5g}, predicted "
                f"{diff[2]:.5g})"
            )
        elif lines and isinstance(lines[-1], list) and (pos, x, y) == tuple(v + 1 for v in lines[-1][-1]):
            lines[-1].append((pos, x, y))  # the run's next row: the next position, the next token's row
        else:
            lines.append([(pos, x, y)])
    out = []
    for line in filter(None, lines):
        if isinstance(line, list):
            (p0, x0, y0), (p1, x1, y1) = line[0], line[-1]
            line = f"{where} {p0}..{p1} (inputs {x0}..{x1}): the rows of inputs {y0}..{y1} ({y0 - x0:+d})"
        out.append(line)
    return out


def against_reference(exchanges, reference, predicted: list[list[float]] | None = None) -> list[str]:
    """Each asking exchange's rows against the no-MTP server's for the same label, row by row (the first that differs
    in each section); with ``predicted`` (``predicted_rows``), each side's row named by whose row it is."""
    ref = {x.label: x for x in reference}
    out: list[str] = []
    counts: list[str] = []
    for ex in exchanges:
        if not ex.payload.get("return_hidden_states") or ex.error:
            continue
        r = ref.get(ex.label)
        mine, theirs = rows_of(ex), rows_of(r) if r is not None else None
        if mine is None or theirs is None:
            out.append(f"{ex.label}: hidden states missing here or on the no-MTP reference")
            continue
        for name, a, b in (("prefill", mine[0], theirs[0]), ("decode", mine[1], theirs[1])):
            for k, (x, y) in enumerate(zip(a, b)):
                diff = row_difference(x, y)
                if diff:
                    where = f"prompt {k}" if name == "prefill" else position_label(k + 1)
                    whose = ""
                    if predicted is not None:
                        here, there = (_row_of(v, predicted) for v in (x, y))
                        whose = f"; here {_whose(here)}, on no-MTP {_whose(there)}"
                    out.append(
                        f"{ex.label} {where}: element {diff[0]} {diff[1]:.5g}, no-MTP {diff[2]:.5g} (beyond "
                        f"{ROW_RTOL:.4f} relative, 2 bf16 ulps{whose})"
                    )
                    break
            if len(a) != len(b):
                counts.append(f"{ex.label}: {len(a)} {name} rows, no-MTP {len(b)}")
    return counts + out  # the counts first: a miscount is the first thing to read


def _whose(token: int | None) -> str:
    return "the row of no input token" if token is None else f"the row of input {token}"
