"""Request family "stop_regex": ``stop_regex`` (sampling_params.py, 0.5.13-0.5.23) matching inside an accepted run
of the witness, against the prediction and the witness without MTP.

sglang checks stop regexes on the decoded tail after each appended run (schedule_batch.py: Req's string-based
finish, ``re.search(stop_regex_str, tail_str)``) and reports FINISH_MATCHED_STR with ``matched`` = the pattern.
Under MTP the run is a whole verify step: the request must still end at the token that completes the first match,
the step's later accepted tokens dropped, exactly as stop strings do (surface/stops.py's prediction and its
positions: 1 prefill, 2-7 step 1, 8-13 step 2, 14-19 step 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpmatrix.tiers.surface import both_answered, reference_gaps
from mtpmatrix.tiers.surface.stops import ASCII_FIRST, chain, prompt, token_text, where

NAME = "stop_regex"
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class Case:
    label: str
    first: str  # what output position 1 decodes to (the chain runs through the ASCII block from it)
    pattern: str
    n: int  # predicted output tokens: the match's last character is output n
    note: str

    @property
    def last(self) -> int:  # the prompt's last token (stops.prompt reads it)
        return ASCII_FIRST + ord(self.first) - 32 - 1


CASES = (
    Case("regex-inside", "5", r"C[D-F]", 16, "match 'CD' ends at output 16, step 3 draft 3"),
    Case("regex-bonus", "?", r"[J-K]{2}", 13, "match 'JK' ends at output 13, step 2 bonus"),
    Case("regex-prefill", "+", r"\+", 1, "match '+' on the prefill token"),
    Case("regex-class", "a", r"[e-g]h", 8, "match 'gh' ends at output 8, step 2 draft 1 (e, f alone do not match)"),
)


def requests(spec, vocab_size: int) -> list[tuple[str, dict]]:
    if spec.pair != PAIR:
        return []
    out = []
    for i, c in enumerate(CASES):
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "stop_regex": [c.pattern]}
        out.append((c.label, {"input_ids": prompt(c, i), "sampling_params": params}))
    return out


def problems(case: Case, ex, vocab: int) -> list[str]:
    if ex.error:
        return [f"{case.label}: request failed: {ex.error}"]
    want = chain(case.last, case.n, vocab)
    text = "".join(token_text(t) for t in want)
    out = []
    if ex.output_ids != want:
        first = next((i for i, (a, b) in enumerate(zip(ex.output_ids, want)) if a != b), None)
        first = min(len(ex.output_ids), len(want)) if first is None else first
        out.append(
            f"{case.label}: {len(ex.output_ids)} output tokens {ex.output_ids[-3:]}, predicted {case.n} ending "
            f"{want[-3:]} (text {text!r}; first difference at output {first + 1}, {where(first + 1)}; {case.note})"
        )
    finish = ex.meta.get("finish_reason")
    if not (isinstance(finish, dict) and finish.get("type") == "stop" and finish.get("matched") == case.pattern):
        out.append(f"{case.label}: finish_reason {finish}, expected stop matched {case.pattern!r}")
    return out


def against_reference(exchanges, reference) -> list[str]:
    return reference_gaps(exchanges, reference) + [
        f"{x.label}: output_ids {x.output_ids} != no-MTP {r.output_ids}"
        for x, r in both_answered(exchanges, reference)
        if x.output_ids != r.output_ids
    ]
