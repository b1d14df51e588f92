"""Request family "structured": structured output (``regex``, ``ebnf``, ``json_schema`` sampling params) on the
witness servers at topk 1 and 3, in one batch with unconstrained greedy neighbours.

What sglang does (installed sources): the grammar backend is xgrammar by default in 0.5.13-0.5.23
(server_args.py: grammar_backend None -> "xgrammar"); sampling_params.py accepts exactly one of json_schema, regex,
ebnf, structural_tag; the JSON schema compiles with any_whitespace=True (constrained/xgrammar_backend.py). Under
speculative decoding verify masks each tree node's logits with the grammar state of its path and the grammar
advances over the accepted tokens (0.5.17+: batch_result_processor.py "spec already advanced it in
_resolve_spec_v2_tokens"). sglang's own test of this (sgl-project/sglang
test/registered/spec/eagle/test_eagle_constrained_decoding.py: EAGLE with the regex kit) runs topk 1 only, its
topk > 1 class and its JSON mixin commented out; here topk 3 runs too, beside unconstrained requests, and the
output is predicted exactly, not only checked for validity.

Can the tiny tokenizer carry a grammar? Yes: xgrammar 0.2.1 (what the 0.5.13 and 0.5.17 rows install) reads the
tiny pairs' tokenizer (pairs/tiny/vocab.py: byte-fallback BPE, printable ASCII one token each) as VocabType.BYTE_FALLBACK
and compiles each grammar below over it (the contract tier checks it per release, on CPU, and walks each grammar as
the witness decodes: tests/tiers/test_contract_grammars.py; xgrammar 0.2.1 on 0.5.13/0.5.17, 0.2.7 on 0.5.23). Every printable
character then has two tokens the grammar allows alike: its ASCII-block token and its byte-fallback twin
<0xNN>. The witness's +1 rule maps both blocks the same way (char c -> c + 1, ASCII after ASCII, byte after byte),
so the decoded text never depends on which twin a forced position took, while the ids may (the twin choice is
between two non-peak logits, nothing the witness predicts). Hence the predictions are on text, and MTP against
no-MTP compares ids with the twins folded together (``fold``), plus the raw ids of every unconstrained neighbour.

Each grammar is built so that at every position either the witness's greedy token (its peak, next = token + 1) is
allowed, and then it is taken, or exactly one character is, and then that one is forced: the text is predicted
exactly. A forced character lands inside a verify step (the drafts proposed the chain, verify must reject them at
that node and take the grammar's token). The grammar's end leaves only stop tokens (EOS 1 and END_OF_TURN 12,
generation_config's eos ids), so each constrained request ends with one of them, finish_reason stop. The JSON
schema is a top-level string: an object lets the grammar's optional whitespace follow a non-peak ranking the
witness does not predict (xgrammar loops on "\\t\\n" for the tiny vocabulary), a string has no whitespace position.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mtpmatrix.pairs.tiny.vocab import END_OF_TURN_ID, EOS_ID, SPECIAL_TOKENS
from mtpmatrix.tiers.surface import both_answered, reference_gaps
from mtpmatrix.tiers.surface.stops import ASCII_FIRST, ASCII_LAST, chain, token_text

NAME = "structured"
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
MAX_NEW_TOKENS = 32
STOP_IDS = (EOS_ID, END_OF_TURN_ID)
BYTE_FIRST = len(SPECIAL_TOKENS)  # <0x00>; the printable bytes 0x20..0x7E are BYTE_FIRST + 0x20 ..


@dataclass(frozen=True)
class Case:
    label: str
    kind: str  # "regex" | "ebnf" | "json_schema" | "none" (an unconstrained neighbour)
    grammar: str
    text: str  # predicted text (constrained: then a stop token ends the output)
    matches: str  # a Python regex the text must fullmatch: the grammar's own language, written as a regex
    note: str


def _first(c: str) -> int:
    """The prompt's last token so that the witness's first output decodes to ``c`` (ASCII block)."""
    return ASCII_FIRST + ord(c) - 32 - 1


CASES = (
    Case(
        "regex",
        "regex",
        r"[a-z]{8}5[0-9]{3}",
        "abcdefgh5678",
        r"[a-z]{8}5[0-9]{3}",
        "the chain a..h, '5' forced at output 9 (step 2 draft 1, where the drafts proposed 'i'), then 6 7 8",
    ),
    Case(
        "ebnf",
        "ebnf",
        'root ::= "abc" ("d" | "x") "efg" "0123"',
        "abcdefg0123",
        r"abc[dx]efg0123",
        "an alternation the chain takes ('d'), then '0' forced at output 8 (step 2's first node)",
    ),
    Case(
        "json-schema",
        "json_schema",
        json.dumps({"type": "string", "pattern": "^ab[c-z]{4}$"}),
        '"abcdef"',
        r'"ab[c-z]{4}"',
        "a JSON string: the quote and 'a' forced, then the chain b..f, the closing quote forced",
    ),
)
NEIGHBOUR_STARTS = (60, 170, 280)  # unconstrained greedy neighbours: +1 chains far from any stop id


def prompt(last: int, index: int) -> list[int]:
    """12 prompt ids: printable byte-fallback ids (stops.prompt's layout), then ``last``."""
    return [46 + (j * 7 + index * 13) % 90 for j in range(11)] + [last]


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR:
        return []
    out = []
    for i, c in enumerate(CASES):
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, c.kind: c.grammar}
        out.append((c.label, {"input_ids": prompt(_first(c.text[0]), i), "sampling_params": params}))
    for i, s in enumerate(NEIGHBOUR_STARTS):
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        out.append((f"neighbour-{s}", {"input_ids": prompt(s, len(CASES) + i), "sampling_params": params}))
    return out


def fold(token: int) -> int:
    """A printable byte-fallback id as its ASCII-block twin (the grammar allows both alike); any other id as is."""
    if BYTE_FIRST + 0x20 <= token <= BYTE_FIRST + 0x7E:
        return ASCII_FIRST + token - BYTE_FIRST - 0x20
    return token


def decode(ids: list[int]) -> str:
    """The tiny tokenizer's text of ``ids`` (printable ASCII in either block). Any other id, a stop id too, is written
    as ``<id N>``: a stop token inside the output is not text the grammar allows (only the last may be one, and
    ``case_problems`` takes it off first)."""
    chars = []
    for t in ids:
        f = fold(t)
        chars.append(token_text(f) if ASCII_FIRST <= f <= ASCII_LAST else f"<id {t}>")
    return "".join(chars)


def case_problems(case: Case, ex) -> list[str]:
    """What is wrong with one constrained exchange on its own: the text (decoded from output_ids, and sglang's
    ``text``) must fullmatch the grammar and equal the prediction, one stop token must end the output, and
    finish_reason must name it."""
    if ex.error:
        return [f"{case.label}: request failed: {ex.error}"]
    ids, out = ex.output_ids, []
    body = ids[:-1] if ids and ids[-1] in STOP_IDS else ids
    text = decode(body)
    if not re.fullmatch(case.matches, text):
        out.append(f"{case.label}: output {text!r} (ids {ids}) is not valid under its {case.kind} {case.grammar!r}")
    elif text != case.text:
        out.append(f"{case.label}: output {text!r} != predicted {case.text!r} ({case.note})")
    if case.kind == "json_schema" and not out:
        try:
            json.loads(text)
        except ValueError as exc:
            out.append(f"{case.label}: output {text!r} is not JSON: {exc}")
    if not ids or ids[-1] not in STOP_IDS:
        out.append(f"{case.label}: output does not end with a stop token {STOP_IDS}: {ids[-3:]} (the grammar ended)")
    finish = ex.meta.get("finish_reason")
    # schedule_batch.py Req.check_finished (0.5.13-0.5.23): a terminated grammar finishes the request with
    # FINISH_MATCHED_TOKEN(matched=output_ids[-1]), an EOS with FINISH_MATCHED_TOKEN of that id: the last id either way
    last = ids[-1] if ids else None
    if not (isinstance(finish, dict) and finish.get("type") == "stop" and finish.get("matched") == last):
        out.append(
            f"{case.label}: finish_reason {finish}, expected a stop matching the last id {last} (the grammar ended)"
        )
    served = ex.response.get("text")
    if served is not None and served != case.text and not out:
        out.append(f"{case.label}: sglang's text {served!r} != the decoded output {text!r}")
    return out


def neighbour_problems(ex, vocab: int) -> list[str]:
    if ex.error:
        return [f"{ex.label}: request failed: {ex.error}"]
    want = chain(ex.payload["input_ids"][-1], MAX_NEW_TOKENS, vocab)
    if ex.output_ids != want:
        first = next((i for i, (a, b) in enumerate(zip(ex.output_ids, want)) if a != b), len(ex.output_ids))
        return [f"{ex.label}: unconstrained neighbour leaves the +1 chain at output {first + 1}: {ex.output_ids}"]
    return []


def own_problems(exchanges, vocab: int) -> list[str]:
    by = {c.label: c for c in CASES}
    out = []
    for ex in exchanges:
        out += case_problems(by[ex.label], ex) if ex.label in by else neighbour_problems(ex, vocab)
    return out


def against_reference(exchanges, reference) -> list[str]:
    """Each exchange against the no-MTP server's of the same label: constrained ids equal with twins folded,
    neighbours' ids equal as they are."""
    out = reference_gaps(exchanges, reference)
    for ex, r in both_answered(exchanges, reference):
        constrained = ex.label in {c.label for c in CASES}
        got = [fold(t) for t in ex.output_ids] if constrained else ex.output_ids
        want = [fold(t) for t in r.output_ids] if constrained else r.output_ids
        if got != want:
            out.append(f"{ex.label}: output_ids {ex.output_ids} != no-MTP {r.output_ids}")
    return out
