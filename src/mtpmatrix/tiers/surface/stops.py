"""Request family "stops": EOS, stop tokens, stop strings and max_new_tokens landing inside a verify step.

Served on the witness pair at sglang's draft phase (witness-mtp-topk1/3, witness-mtp-topk3-eager and the no-MTP
reference witness-nomtp). Its target's greedy rule is next = token + 1 (mod vocab) and an intact MTP path accepts
every draft, so where each output token comes from is known: position 1 (1-based) from the prefill, then verify
step s keeps positions 6s - 4 .. 6s + 1 (5 drafts, then the bonus token at 6s + 1; STEP = NUM_STEPS + 1 = 6). Each
request puts its stop on a chosen position: the prefill token, strictly inside a step's accepted drafts, on a
step's bonus token, or inside the step that crosses max_new_tokens. ``ignore_eos`` is false throughout.

What a correct server returns, and where sglang says so (installed sources, file:function):
* output_ids end at the stop, the stop token (EOS, stop_token_ids, the last token of a stop string) included:
  the output streamer sends ``Req.output_ids_through_stop`` = output_ids[:finished_len]
  (scheduler_components/output_streamer.py:accept, 0.5.13 and 0.5.17; finished_len set by
  schedule_batch.py:Req._check_token_based_finish / _locate_str_stop_finished_len (0.5.17+), or by the streamer to
  len(output_ids) when unset, 0.5.13's stop strings), and completion_tokens = len(that). Only ``text`` is trimmed
  (detokenizer_manager.py:trim_matched_stop drops the last token of a matched token, cuts the text at a matched
  string).
* EOS: Req.eos_token_ids = ModelConfig.hf_eos_token_id = config eos_token_id | generation_config eos_token_id
  (configs/model_config.py:_get_hf_eos_token_id; scheduler.py passes it to every Req, input_ids or text), so
  END_OF_TURN_ID 12, which only generation_config names, ends a request like EOS_ID 1.
* finish_reason: {"type": "stop", "matched": <token id or string>} / {"type": "length", "length": max_new_tokens}
  (schedule_batch.py FINISH_MATCHED_TOKEN / FINISH_MATCHED_STR / FINISH_LENGTH.to_json).
* The first stop in token order wins, as without MTP (one token at a time). 0.5.13's Frozen-KV MTP verify
  (speculative/eagle_info.py:EagleVerifyInput.verify, the v1 path) appends accepted tokens one by one and calls
  update_finish_state() after each, so it stops there; the spec-v2 path (0.5.17+, overlap scheduler:
  batch_result_processor.py:process_batch_result_decode) appends the whole run and calls
  update_finish_state(new_accept_len) once, whose order decides. 0.5.17 checks max_new_tokens first (an EOS inside
  the step that crosses it stays in the output, tokens after it kept up to the limit) and stop strings before
  tokens (a stop string later in the run beats an EOS earlier in it); 0.5.23 moved the length check last
  (_cap_finished_len_at_max_new_tokens) but still checks strings first. Both are deviations: docs/upstream/
  sglang-spec-v2-stop-order.md. The checks stay strict.
* An EOS exactly at max_new_tokens is a convention, not an error: 0.5.13/0.5.17 say length (length checked first,
  with or without MTP), 0.5.23 says stop. Either is accepted there, and MTP must equal no-MTP.
* Counters: spec_verify_ct counts every verify step that settled the request up to and including the one it
  finished in (0.5.13 eagle_info.py:EagleVerifyInput.verify; 0.5.17 batch_result_processor.py:
  _resolve_spec_v2_tokens skips requests already finished, so an overlap step launched after the finish counts
  nothing); spec_num_correct_drafts and the histogram count what verify accepted, uncut by the stop (0.5.13 reads
  the accept row before it is cut at the stop; 0.5.17 uses accept_lens - 1 of the verify kernel, which never sees
  stops). So for the witness a request with n output tokens has spec_verify_ct = ceil((n - 1) / 6), 5 correct
  drafts per step, histogram [0, 0, 0, 0, 0, V]; n = 1 (done at prefill) has none (tokenizer_manager.py:
  _calculate_spec_decoding_metrics writes no spec field when spec_verify_ct is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mtpmatrix.core import settings
from mtpmatrix.pairs.tiny.vocab import END_OF_TURN_ID, EOS_ID, SPECIAL_TOKENS

NAME = "stops"
PAIR = "witness-sglang-phase"  # the servers this family is sent to (spec.pair)
NO_MTP_REFERENCE = "witness-nomtp"
STEP = settings.NUM_STEPS + 1  # tokens one witness verify step keeps: every draft and the bonus token
MAX_NEW_TOKENS = 32  # the stop requests' budget: every stop below lands well before it
LIMIT = 10  # the length requests' budget: not 1 + 6k, so the limit falls inside verify step 2 (positions 8-13)
# The tiny tokenizer (pairs/tiny/vocab.py:make_tokenizer): special ids, 256 byte-fallback tokens, then printable ASCII
# (32..126) and "\n", one token each, then "<unusedN>". A chain of ids in the ASCII block decodes to consecutive
# characters, each once: stop strings are picked there.
ASCII_FIRST = len(SPECIAL_TOKENS) + 256
ASCII_LAST = ASCII_FIRST + (127 - 32) - 1


def token_text(token: int) -> str:
    """What the tiny tokenizer decodes ``token`` to, for the printable-ASCII block only."""
    if not ASCII_FIRST <= token <= ASCII_LAST:
        raise ValueError(f"token {token} is outside the tiny tokenizer's printable-ASCII block")
    return chr(32 + token - ASCII_FIRST)


def chain(last: int, n: int, vocab: int) -> list[int]:
    """The witness target's greedy output after a prompt ending at ``last``: last + 1, last + 2, ... (mod vocab)."""
    return [(last + i) % vocab for i in range(1, n + 1)]


def where(position: int) -> str:
    """Where output position ``position`` (1-based) comes from for the witness: prefill, a step's drafts or its
    bonus token."""
    if position == 1:
        return "prefill"
    step = math.ceil((position - 1) / STEP)
    return f"step {step} " + ("bonus" if (position - 1) % STEP == 0 else f"draft {(position - 2) % STEP + 1}")


def verify_steps(n: int) -> int:
    """Verify steps a witness request that ends with ``n`` output tokens runs: the first comes from the prefill."""
    return math.ceil((n - 1) / STEP) if n >= 1 else 0


def predicted_counters(n: int) -> dict:
    """spec_verify_ct, spec_num_correct_drafts and the histogram (trailing zeros cut) of a witness request of ``n``
    output tokens: every step accepts all NUM_STEPS drafts, the stop cuts none of them from the count."""
    v = verify_steps(n)
    hist = [0] * settings.NUM_STEPS + [v] if v else []
    return {
        "spec_verify_ct": v,
        "spec_num_correct_drafts": settings.NUM_STEPS * v,
        "spec_correct_drafts_histogram": hist,
    }


@dataclass(frozen=True)
class Case:
    label: str
    kind: str  # "stop" (test_stop_ends_the_output_exactly) or "length" (test_length_cut_mid_step)
    last: int  # the prompt's last token: the output is chain(last, ...)
    n: int  # predicted completion tokens (the stop included)
    max_new_tokens: int = MAX_NEW_TOKENS
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    finish: tuple[dict, ...] = ()  # the finish_reason(s) a correct server may return
    text: str | None = None  # predicted ``text`` (stop strings only)
    note: str = ""

    def output(self, vocab: int) -> list[int]:
        return chain(self.last, self.n, vocab)


def _eos_at(position: int, token: int, vocab: int) -> int:
    """The prompt's last token that puts ``token`` at output ``position``."""
    return (token - position) % vocab


def _matched(stop: int | str) -> dict:
    """The finish_reason of a request ended by the stop token or string ``stop``."""
    return {"type": "stop", "matched": stop}


def _length(max_new_tokens: int) -> dict:
    """The finish_reason of a request cut at ``max_new_tokens``."""
    return {"type": "length", "length": max_new_tokens}


def _eos_case(label: str, eos: int, position: int, vocab: int, note: str, stop: tuple[str, ...] = ()) -> Case:
    """An EOS id (``eos``) at output ``position``, the request's ``stop`` strings (if any) later."""
    return Case(label, "stop", _eos_at(position, eos, vocab), position, stop=stop, finish=(_matched(eos),), note=note)


def _stop_token_case(label: str, last: int, position: int, stop_token_ids: tuple[int, ...], note: str) -> Case:
    """stop_token_ids whose first id is output ``position`` after a prompt ending at ``last``."""
    finish = (_matched(stop_token_ids[0]),)
    return Case(label, "stop", last, position, stop_token_ids=stop_token_ids, finish=finish, note=note)


def _str_case(label: str, first_char: str, position: int, stop: str, note: str) -> Case:
    """A stop string over the ASCII block: output position 1 decodes to ``first_char``, the stop string's last
    character is at ``position``."""
    last = ASCII_FIRST + ord(first_char) - 32 - 1
    out = [last + i for i in range(1, position + 1)]
    text = "".join(token_text(t) for t in out)
    if not text.endswith(stop) or text.count(stop) != 1:
        raise ValueError(f"{label}: stop string {stop!r} must end the output text {text!r} and occur once")
    return Case(
        label,
        "stop",
        last,
        position,
        stop=(stop,),
        finish=(_matched(stop),),
        text=text[: text.find(stop)],
        note=note,
    )


def _length_case(
    label: str, last: int, max_new_tokens: int, note: str, *, n: int | None = None, finish: tuple[dict, ...] = ()
) -> Case:
    """A request of ``max_new_tokens`` after a prompt ending at ``last``: ``n`` output tokens (the limit unless
    given) and ``finish`` (a length finish unless given)."""
    n = max_new_tokens if n is None else n
    finish = finish or (_length(max_new_tokens),)
    return Case(label, "length", last, n, max_new_tokens=max_new_tokens, finish=finish, note=note)


def cases(vocab: int) -> list[Case]:
    """Every request of the family with its prediction. Positions: 1 prefill, 2-7 step 1 (7 bonus), 8-13 step 2
    (13 bonus), 14-19 step 3 (19 bonus)."""
    out = [
        # END_OF_TURN_ID is an EOS only through generation_config: the first token, from the prefill
        _eos_case("eot-prefill", END_OF_TURN_ID, 1, vocab, "generation_config EOS 12 as the prefill token"),
        # EOS_ID through the wrap 509, 510, 511, 0, 1 (ids >= 366 are <unusedN>, 0 PAD: no special id in a prompt)
        _eos_case("eos-inside", EOS_ID, 10, vocab, "EOS at position 10, step 2 draft 3"),
        _eos_case("eos-bonus", EOS_ID, 13, vocab, "EOS at position 13, step 2 bonus"),
        _stop_token_case("stop-token-prefill", 170, 1, (171,), "stop_token_ids at position 1, the prefill token"),
        _stop_token_case(
            "stop-token-inside",
            150,
            4,
            (154, 160),
            "stop_token_ids at position 4, step 1 draft 3 (a second id later must not matter)",
        ),
        _stop_token_case("stop-token-bonus", 160, 7, (167,), "stop_token_ids at position 7, step 1 bonus"),
        _str_case("stop-str-prefill", "+", 1, "+", "stop string on the prefill token"),
        _str_case("stop-str-inside", "5", 16, "CD", "two-token stop string ending at position 16, step 3 draft 3"),
        _str_case("stop-str-bonus", "?", 13, "JK", "two-token stop string ending at position 13, step 2 bonus"),
        # an EOS at 10 and a stop string completed at 12 ('<unk>' is token 3), both in step 2: the EOS comes first
        _eos_case(
            "eos-before-stop-str",
            EOS_ID,
            10,
            vocab,
            "EOS at position 10, a stop string at 12, same verify step",
            stop=("<unk>",),
        ),
        # max_new_tokens not 1 + 6k: cut inside step 2
        _length_case("length-mid-step", 180, LIMIT, "max_new_tokens 10 inside step 2 (positions 8-13)"),
        _length_case("length-one", 185, 1, "max_new_tokens 1: the prefill token alone"),
        _length_case(
            "length-eos-before-limit",
            _eos_at(9, EOS_ID, vocab),
            LIMIT,
            "EOS at position 9 inside the step that crosses max_new_tokens 10",
            n=9,
            finish=(_matched(EOS_ID),),
        ),
        _length_case(
            "length-eos-after-limit",
            _eos_at(12, EOS_ID, vocab),
            LIMIT,
            "EOS at position 12, past max_new_tokens 10, in the crossing step",
        ),
        # 0.5.13/0.5.17: length (checked first); 0.5.23: stop (tokens first, capped only past the limit)
        _length_case(
            "length-eos-at-limit",
            _eos_at(LIMIT, EOS_ID, vocab),
            LIMIT,
            "EOS exactly at max_new_tokens 10",
            finish=(_length(LIMIT), _matched(EOS_ID)),
        ),
    ]
    for c in out:  # the chain must stay clear of EOS / END_OF_TURN / the stop ids before the predicted end
        ends = {EOS_ID, END_OF_TURN_ID, *c.stop_token_ids}
        early = [t for t in c.output(vocab)[:-1] if t in ends]
        if early:
            raise ValueError(f"{c.label}: a stop falls before the predicted end: {early}")
    return out


def prompt(case: Case, index: int) -> list[int]:
    """12 prompt ids: 11 byte-fallback ids of printable ASCII bytes 0x20-0x79 (no special, multimodal or EOS id; the
    detokenizer's look-back over the prompt decodes cleanly), then the case's last token."""
    return [46 + (j * 7 + index * 13) % 90 for j in range(11)] + [case.last]


def payload(case: Case, index: int) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": case.max_new_tokens, "ignore_eos": False}
    if case.stop_token_ids:
        params["stop_token_ids"] = list(case.stop_token_ids)
    if case.stop:
        params["stop"] = list(case.stop)
    return {"input_ids": prompt(case, index), "sampling_params": params}


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR:
        return []
    return [(c.label, payload(c, i)) for i, c in enumerate(cases(vocab_size))]


# --------------------------------------------------------------------------------------- judging


def _finish(response: dict):
    return (response.get("meta_info") or {}).get("finish_reason")


def _finish_ok(case: Case, got) -> bool:
    return isinstance(got, dict) and any(all(got.get(k) == v for k, v in f.items()) for f in case.finish)


def output_problems(case: Case, exchange, vocab: int, reference=None) -> list[str]:
    """What is wrong with one exchange's output: its output_ids, finish_reason and (stop strings) text against the
    prediction, and output_ids / finish_reason against the no-MTP server's exchange of the same label
    (``reference``). Empty when all agree."""
    want = case.output(vocab)
    if exchange.error:
        return [f"request failed: {exchange.error}"]
    got, finish = exchange.output_ids, _finish(exchange.response)
    out = []
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        out.append(
            f"output_ids {_short(got)} (len {len(got)}) != predicted {_short(want)} (len {len(want)}), first "
            f"difference at position {first + 1} ({where(first + 1)})"
        )
    if not _finish_ok(case, finish):
        out.append(f"finish_reason {finish} != predicted {' or '.join(map(str, case.finish))}")
    if case.text is not None and exchange.response.get("text") != case.text:
        out.append(f"text {exchange.response.get('text')!r} != predicted {case.text!r} (stop string trimmed)")
    if reference is not None and not reference.error:
        if reference.output_ids != got:
            out.append(f"MTP output_ids {_short(got)} != no-MTP {_short(reference.output_ids)}")
        if _finish(reference.response) != finish:
            out.append(f"MTP finish_reason {finish} != no-MTP {_finish(reference.response)}")
    return out


def counter_problems(n: int, meta: dict) -> list[str]:
    """Where one witness request's speculative counters differ from predicted_counters(n), ``n`` its predicted
    output length. Each release's spelling is read (meta_fields.ALIASES); a missing counter reads as 0 / []."""
    want = predicted_counters(n)
    out = []
    verify = meta.get("spec_verify_ct") or 0
    if verify != want["spec_verify_ct"]:
        out.append(f"spec_verify_ct {verify} != predicted {want['spec_verify_ct']}")
    correct = next((meta[k] for k in ("spec_num_correct_drafts", "spec_accepted_drafts") if meta.get(k) is not None), 0)
    if correct != want["spec_num_correct_drafts"]:
        out.append(f"spec_num_correct_drafts {correct} != predicted {want['spec_num_correct_drafts']}")
    hist = list(next((meta[k] for k in ("spec_correct_drafts_histogram", "spec_accept_histogram") if meta.get(k)), []))
    while hist and hist[-1] == 0:
        hist.pop()
    if hist != want["spec_correct_drafts_histogram"]:
        out.append(f"histogram {hist} != predicted {want['spec_correct_drafts_histogram']}")
    return out


def accounting_problems(
    case: Case, exchange, *, fields: tuple[str, ...] | None, draft_tokens: int | None, steps: int = settings.NUM_STEPS
) -> list[str]:
    """What a finished request's response contradicts in itself, whatever the release's conventions: completion
    tokens = len(output_ids) <= max_new_tokens; a length finish used exactly max_new_tokens; a matched stop token
    ends output_ids and is an EOS or a requested stop id; a matched string is a requested one; and (MTP,
    ``fields`` given) the speculative fields agree with each other and with completion_tokens
    (meta_fields.disagreements: every step settled tokens that are in the output, none ran after the finish)."""
    from mtpmatrix.tiers.compat import meta_fields

    if exchange.error:
        return [f"request failed: {exchange.error}"]
    ids, meta, finish = exchange.output_ids, exchange.meta, _finish(exchange.response)
    n = meta.get("completion_tokens")
    out = []
    if n != len(ids):
        out.append(f"completion_tokens {n} != len(output_ids) {len(ids)}")
    if not isinstance(n, int) or n > case.max_new_tokens:
        out.append(f"completion_tokens {n} beyond max_new_tokens {case.max_new_tokens}")
    kind = finish.get("type") if isinstance(finish, dict) else None
    matched = finish.get("matched") if isinstance(finish, dict) else None
    if kind == "length":
        if n != case.max_new_tokens or finish.get("length") != case.max_new_tokens:
            out.append(f"finish_reason {finish} with completion_tokens {n}, max_new_tokens {case.max_new_tokens}")
    elif kind == "stop" and isinstance(matched, int) and not isinstance(matched, bool):
        if not ids or ids[-1] != matched or matched not in {EOS_ID, END_OF_TURN_ID, *case.stop_token_ids}:
            out.append(
                f"finish_reason {finish} but output_ids end {ids[-3:]} (stop ids: EOS {EOS_ID}, "
                f"{END_OF_TURN_ID}, requested {list(case.stop_token_ids)})"
            )
    elif kind == "stop" and isinstance(matched, str):
        if matched not in case.stop:
            out.append(f"finish_reason {finish} matched no requested stop string {list(case.stop)}")
    else:
        out.append(f"finish_reason {finish} is neither a stop nor a length finish")
    if fields is not None and isinstance(n, int):
        out += meta_fields.disagreements(meta, fields=fields, draft_tokens=int(draft_tokens), steps=steps)
    return out


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 16 else f"[{', '.join(map(str, ids[:6]))}, ..., {', '.join(map(str, ids[-6:]))}]"


def judge(run, kind: str, vocab: int, reference=None) -> tuple[list[tuple[str, list[str]]], dict]:
    """(label, problems) of every request of ``kind`` on ``run`` that has problems, and what each request returned
    (label -> [completion_tokens, finish_reason]) for record_property."""
    by_label = {x.label: x for x in run.exchanges(NAME)}
    ref = {x.label: x for x in reference.exchanges(NAME)} if reference is not None else {}
    bad, seen = [], {}
    for case in (c for c in cases(vocab) if c.kind == kind):
        x = by_label.get(case.label)
        if x is None:
            bad.append((case.label, ["no exchange: the tier did not send this request"]))
            continue
        seen[case.label] = [x.meta.get("completion_tokens"), _finish(x.response)]
        problems = output_problems(case, x, vocab, ref.get(case.label))
        if problems:
            bad.append((case.label, [f"({case.note}) "] + problems))
    return bad, seen
