"""Answers of the fake sglang (fake_sglang.FakeState.shapes) for the request shapes of the surface families
structured, hidden_states, stop_regex, token_ids_logprob, streaming and parallel_n: a witness-like server whose
greedy output is the +1 chain, in sglang's wire format (read from its source, see each family's docstring). Unit
tests only. ``broken`` names one fault, so a test sees a family's check fail on it:

  stream-gap        the last /generate stream event misses the final token (events do not reassemble)
  hidden-extra-row  one decode hidden-state row too many (a verify step's rejected row kept)
  hidden-wrong-row  decode row k holds the row of input out[k + 1] (a node off)
  grammar           the regex request's forced '5' comes out '6' (invalid under its grammar)
  stop-regex-late   a stop_regex request ends one token after the match
  ids-logprob       the asked ids' logprobs read one position late
  usage             /v1/completions reports one completion token less
  n-short           n > 1 answers n - 1 samples
  n-one-sample      n > 1 answers one sample n times (one id: the request ran once, its answer copied)
  plain-empty       every /generate and /v1/completions answer is empty (no ids, no text, 0 tokens in usage: empty
                    and consistent), the chat answer intact
  spec-details      the OpenAI answers' sglext.spec_tokens_details count one verify step more

and one per request-shape mutant of the catalogue (mtpmatrix.faults.catalogue.request_surface), the server's answers
as that mutant makes sglang give them:

  grammar-unmasked  a constrained output stops before its first forced character past the prefill token, finish
                    "abort" (verify accepted the chain's token, the grammar refused it: grammar-verify-unmasked)
  stop-regex-step-end
                    a stop_regex request ends at the last token of the step the match is in (stop-regex-at-step-end)
  ids-logprob-early the asked ids' logprobs read one position early (ids-logprob-node-early)
  stream-last-only  each /generate stream event adds only the newest token since the last event
                    (stream-run-last-token-only)
"""

from __future__ import annotations

import re
import threading

from mtpmatrix.pairs.tiny.vocab import EOS_ID
from mtpmatrix.tiers.surface import hidden_states, structured
from mtpmatrix.tiers.surface.logprobs import GAP
from mtpmatrix.tiers.surface.stops import ASCII_FIRST, ASCII_LAST, token_text

VOCAB = 512
STEP = 6  # tokens per stream event: one witness verify step


def decode(ids: list[int]) -> str:
    return "".join(token_text(t) if ASCII_FIRST <= t <= ASCII_LAST else f"<unused{t}>" for t in ids if t != EOS_ID)


def hidden_row(x: int) -> list[float]:
    """The fake witness's row of input token x: a function of x alone, no two tokens' rows alike (element 0)."""
    return [1.0 + x / 8] + [((x * 7 + i) % 13 - 6) / 4 for i in range(1, hidden_states.HIDDEN)]


PREDICTED_ROWS = [hidden_row(x) for x in range(VOCAB)]  # what hidden_states.predicted_rows reads for the fake


def top_row(x: int, n: int) -> list[list]:
    """A witness row of input token x for ``top_logprobs_num`` n: x + 1 at the peak, runner-ups >= GAP below it."""
    return [[-1e-3, (x + 1) % VOCAB, None]] + [[-(GAP + 0.3 * k), (x + 37 * k) % VOCAB, None] for k in range(1, n)]


def cached_prefix(prompt: list[int], seen: list[list[int]]) -> int:
    """sglang's radix-cache hit for ``prompt`` after ``seen`` were prefilled (page size 1, no MTP): the longest prefix
    it shares with one of them, less the last token (the scheduler always computes at least one)."""
    best = 0
    for other in seen:
        n = next((i for i, (a, b) in enumerate(zip(prompt, other)) if a != b), min(len(prompt), len(other)))
        best = max(best, n)
    return min(best, len(prompt) - 1)


class WitnessShapes:
    def __init__(self, broken: str = ""):
        self.broken = broken
        self.drop_done = False
        self.prefilled: list[list[int]] = []  # every prompt so far: the radix cache
        self.lock = threading.Lock()

    def __call__(self, path: str, payload: dict):
        if path == "/v1/completions":
            return self._completions(payload)
        if path == "/v1/chat/completions":
            return self._chat(payload)
        params = payload.get("sampling_params") or {}
        n = params.get("n", 1)
        if n > 1:  # sglang: one answer per sample, each its own request (its own rid)
            one = self._generate(payload)
            ids = [f"{k}" for k in range(n)] if self.broken != "n-one-sample" else ["0"] * n
            samples = [{**one, "meta_info": {**one["meta_info"], "id": i}} for i in ids]
            return samples[: n - (self.broken == "n-short")]
        if payload.get("stream"):
            return self._events(self._generate(payload))
        return self._generate(payload)

    def _output(self, prompt: list[int], params: dict) -> list[int]:
        limit = params.get("max_new_tokens", 16)
        for c in structured.CASES:
            if params.get(c.kind) == c.grammar:
                text = c.text
                if self.broken == "grammar" and c.kind == "regex":
                    text = text.replace("5", "6")
                if self.broken == "grammar-unmasked":  # cut where the chain's next character is not the text's
                    cut = next((i for i in range(1, len(text)) if ord(text[i]) != ord(text[i - 1]) + 1), len(text))
                    return [ASCII_FIRST + ord(ch) - 32 for ch in text[:cut]] + ([EOS_ID] if cut == len(text) else [])
                return [ASCII_FIRST + ord(ch) - 32 for ch in text] + [EOS_ID]
        out = [(prompt[-1] + k) % VOCAB for k in range(1, limit + 1)]
        for pattern in params.get("stop_regex") or []:
            for n in range(1, len(out) + 1):
                if re.search(pattern, decode(out[:n])):
                    if self.broken == "stop-regex-step-end":  # steps end after outputs 1, 7, 13, 19, ...
                        return out[: next(1 + STEP * k for k in range(len(out)) if 1 + STEP * k >= n)]
                    return out[: n + (self.broken == "stop-regex-late")]
        return out

    def _generate(self, payload: dict, chat: bool = False) -> dict:
        params = payload.get("sampling_params") or {}
        prompt = payload["input_ids"]
        with self.lock:
            cached = cached_prefix(prompt, self.prefilled)
            self.prefilled.append(list(prompt))
        out = self._output(prompt, params)
        if self.broken == "plain-empty" and not chat:
            return {"text": "", "output_ids": [], "meta_info": {"finish_reason": None, "completion_tokens": 0}}
        stopped = out[-1] == EOS_ID or bool(params.get("stop_regex"))
        matched = (params.get("stop_regex") or [EOS_ID])[0]
        constrained = any(params.get(c.kind) == c.grammar for c in structured.CASES)
        meta = {
            "finish_reason": {"type": "abort", "message": "grammar refused an accepted token"}
            if self.broken == "grammar-unmasked" and constrained and out[-1] != EOS_ID
            else {"type": "stop", "matched": matched}
            if stopped
            else {"type": "length", "length": len(out)},
            "prompt_tokens": len(prompt),
            "cached_tokens": cached,
            "completion_tokens": len(out),
            "spec_verify_ct": (len(out) - 1 + STEP - 1) // STEP,
        }
        if payload.get("return_hidden_states"):
            inputs = [*prompt, *out]
            decode_rows = [hidden_row(out[k + (self.broken == "hidden-wrong-row")]) for k in range(len(out) - 1)]
            if self.broken == "hidden-extra-row":
                decode_rows.append(hidden_row(out[-1]))
            # the prefill block: the rows sglang computed, none for the radix-cached prefix (0.5.17+: extend_input_len)
            meta["hidden_states"] = [[hidden_row(x) for x in inputs[cached : len(prompt)]], *decode_rows]
        top_n = payload.get("top_logprobs_num")
        if top_n:
            rows = [top_row(x, top_n) for x in [prompt[-1], *out[:-1]]]
            meta["output_top_logprobs"] = rows
            meta["output_token_logprobs"] = [[r[0][0], t, None] for r, t in zip(rows, out)]
        asked = payload.get("token_ids_logprob")
        if asked:
            shift = (self.broken == "ids-logprob") - (self.broken == "ids-logprob-early")
            meta["output_token_ids_logprobs"] = [
                [[-1e-3 if t == out[min(max(k + shift, 0), len(out) - 1)] else -9.0, t, None] for t in asked]
                for k in range(len(out))
            ]
        return {"text": decode(out), "output_ids": out, "meta_info": meta}

    def _events(self, answer: dict) -> list[dict]:
        ids = answer["output_ids"]
        cuts = [1 + STEP * k for k in range(len(ids)) if 1 + STEP * k < len(ids)] + [len(ids)]
        if self.broken == "stream-gap":
            cuts[-1] -= 1
        sent = [ids[:c] for c in cuts]
        if self.broken == "stream-last-only":  # event k adds ids[c_k - 1] alone
            sent = [[ids[c - 1] for c in cuts[: k + 1]] for k in range(len(cuts))]
        events = [{"text": None, "output_ids": s, "meta_info": {"completion_tokens": c}} for s, c in zip(sent, cuts)]
        return events[:-1] + [{**answer, "output_ids": sent[-1]}]

    def _completions(self, payload: dict) -> dict | list:
        answer = self._generate(
            {"input_ids": payload["prompt"], "sampling_params": {"max_new_tokens": payload["max_tokens"]}}
        )
        return self._openai(payload, answer, "text")

    def _chat(self, payload: dict) -> dict | list:
        last = ASCII_FIRST + 95  # the chat template ends on "\n"
        answer = self._generate(
            {"input_ids": [last], "sampling_params": {"max_new_tokens": payload["max_tokens"]}}, chat=True
        )
        return self._openai(payload, answer, "content")

    def _openai(self, payload: dict, answer: dict, key: str) -> dict | list:
        tokens = answer["meta_info"]["completion_tokens"] - (self.broken == "usage")
        usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}
        text = answer["text"]
        sglext = None
        if payload.get("return_spec_tokens_details"):  # 0.5.23's shape (utils.spec_tokens_details_from_meta_info)
            details = {k: v for k, v in answer["meta_info"].items() if k.startswith("spec_")}
            if self.broken == "spec-details":
                details["spec_verify_ct"] += 1
            sglext = {"spec_tokens_details": details}
        if not payload.get("stream"):
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"text": text} if key == "text" else {"message": {"role": "assistant", "content": text}})
            return {"choices": [choice], "usage": usage, **({"sglext": sglext} if sglext else {})}
        chunks = [text[i : i + STEP] for i in range(0, len(text), STEP)]
        part = (lambda t: {"text": t}) if key == "text" else (lambda t: {"delta": {"content": t}})
        events = [{"choices": [{"index": 0, **part(t)}], "usage": None} for t in chunks]
        ext = [{"choices": [], "sglext": sglext}] if sglext else []
        return events + ext + [{"choices": [], "usage": usage}]
