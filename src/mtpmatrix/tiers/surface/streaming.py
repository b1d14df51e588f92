"""Request family "streaming": streamed answers (native /generate ``stream: true``) and the OpenAI-compatible
endpoints (/v1/completions, /v1/chat/completions, streamed and not), each beside the same prompt asked plainly on
/generate, on the witness servers.

What sglang sends (installed sources, 0.5.13-0.5.23):
* /generate with ``stream: true`` (entrypoints/http_server.py:generate_request): server-sent events
  ``data: {json}`` and ``data: [DONE]``. Without --incremental-streaming-output (off by default) every event holds
  the whole output so far (tokenizer_manager.py: ``state.output_ids`` cumulative, ``text`` in the last), and the
  last event is the finished answer with the final meta_info, speculative fields included. Under MTP an event
  follows each verify step, so output_ids grow by whole accepted runs.
* /v1/completions (serving_completions.py): ``choices[0].text``; streamed, each chunk's ``choices[0].text`` is the
  new text only, and with ``stream_options.include_usage`` a last chunk with ``choices: []`` and ``usage``
  (UsageProcessor.calculate_streaming_usage). /v1/chat/completions the same with ``message.content`` /
  ``delta.content`` (the chat template: pairs/tiny/vocab.CHAT_TEMPLATE). Usage must be /generate's completion_tokens.
  Speculative fields: 0.5.13 and 0.5.17 have none there (no ``spec`` in entrypoints/openai/); 0.5.23 adds the
  request field ``return_spec_tokens_details`` and answers ``sglext.spec_tokens_details`` (utils.py:
  spec_tokens_details_from_meta_info: the request's spec_* meta_info fields; streamed, in a chunk of its own with
  ``choices: []``). Every OpenAI request asks for it (older releases' request models ignore unknown fields:
  pydantic's default, no ``extra="forbid"`` on CompletionRequest / ChatCompletionRequest); where the release has it
  (``SPEC_TOKENS_DETAILS``), an MTP server's answer must carry them equal to /generate's for the same prompt.
So on every server: each plain /generate answer is the witness's chain (the +1 chain of MAX_NEW_TOKENS tokens
through the printable-ASCII block, its text one character a token), so nothing below can pass on empty answers;
streamed events reassemble to the plain answer (ids, text, completion_tokens and every
``spec_*`` field of the final meta_info), OpenAI texts equal /generate's text, streamed deltas equal the unstreamed
text, usage equals completion_tokens; across servers: MTP equals no-MTP.
"""

from __future__ import annotations

from mtpmatrix.pairs.tiny.vocab import VOCAB
from mtpmatrix.serving.client import Call
from mtpmatrix.serving.environment import by_release, version_of
from mtpmatrix.tiers.compat.meta_fields import CORE_FIELDS
from mtpmatrix.tiers.surface import both_answered, reference_gaps
from mtpmatrix.tiers.surface.stops import ASCII_FIRST, chain, token_text

NAME = "streaming"
PAIR = "witness-sglang-phase"
REFERENCE_SERVER = "witness-nomtp"
MAX_NEW_TOKENS = 32
# prompts' last tokens: the output runs through the printable-ASCII block (text decodes one character a token)
LASTS = (ASCII_FIRST + 1, ASCII_FIRST + 40)
CHAT = [{"role": "user", "content": "Count on from here: abc"}]
SPEC_TOKENS_DETAILS = ((">=0.5.23", True),)  # releases whose OpenAI answers carry sglext.spec_tokens_details
# the fields compared with /generate's meta_info (SpecTokensDetails fills an absent one with 0: only those the
# plain answer has count)
SPEC_FIELDS = CORE_FIELDS  # the speculative meta_info fields every release names alike (compat.meta_fields)


def has_spec_details(version: str | None = None) -> bool:
    return by_release(SPEC_TOKENS_DETAILS, version or version_of("sglang"), False)


def _prompt(last: int) -> list[int]:
    return [46 + (j * 11) % 90 for j in range(11)] + [last]


def requests(spec, vocab_size: int) -> list[tuple[str, dict | Call]]:
    if spec.pair != PAIR:
        return []
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    openai = {"temperature": 0.0, "max_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "return_spec_tokens_details": True}
    usage = {"stream_options": {"include_usage": True}}
    out: list[tuple[str, dict | Call]] = []
    for last in LASTS:
        ids = _prompt(last)
        out += [
            (f"plain-{last}", {"input_ids": ids, "sampling_params": dict(params)}),
            (f"stream-{last}", Call("/generate", {"input_ids": ids, "sampling_params": params, "stream": True}, True)),
            (f"completions-{last}", Call("/v1/completions", {"prompt": ids, **openai})),
            (
                f"completions-stream-{last}",
                Call("/v1/completions", {"prompt": ids, **openai, "stream": True, **usage}, True),
            ),
        ]
    out += [
        ("chat", Call("/v1/chat/completions", {"messages": CHAT, **openai})),
        ("chat-stream", Call("/v1/chat/completions", {"messages": CHAT, **openai, "stream": True, **usage}, True)),
    ]
    return out


def events(ex) -> list[dict]:
    return list(ex.response.get("stream_events") or [])


def openai_text(ex) -> str | None:
    """The text of an OpenAI answer: choices[0].text / message.content, or the streamed chunks' deltas joined."""
    if "stream_events" not in ex.response:
        choices = ex.response.get("choices") or [{}]
        return choices[0].get("text", (choices[0].get("message") or {}).get("content"))
    parts = []
    for e in events(ex):
        for c in e.get("choices") or []:
            parts.append(c.get("text") if "text" in c else (c.get("delta") or {}).get("content") or "")
    return "".join(p or "" for p in parts)


def usage_tokens(ex) -> int | None:
    """usage.completion_tokens of an OpenAI answer (streamed: the usage chunk's)."""
    found = [e.get("usage") for e in events(ex) if e.get("usage")] or [ex.response.get("usage")]
    return (found[-1] or {}).get("completion_tokens")


def spec_details(ex) -> dict | None:
    """An OpenAI answer's sglext.spec_tokens_details (streamed: from its sglext chunk); None when absent."""
    for obj in [ex.response, *events(ex)]:
        found = (obj.get("sglext") or {}).get("spec_tokens_details")
        if isinstance(found, dict):
            return found
    return None


def spec_detail_problems(ex, plain, release_has: bool) -> list[str]:
    """An OpenAI answer's speculative fields against /generate's for the same prompt: equal where the release
    reports them and the plain answer has them (an MTP server); none asked of a release without them."""
    if not release_has or "spec_verify_ct" not in plain.meta:
        return []
    details = spec_details(ex)
    if details is None:
        return [f"{ex.label}: no sglext.spec_tokens_details (asked with return_spec_tokens_details)"]
    differ = [
        f"{k} {details.get(k)} != {plain.meta[k]}"
        for k in SPEC_FIELDS
        if k in plain.meta and details.get(k) != plain.meta[k]
    ]
    return [f"{ex.label}: spec_tokens_details against /generate's: {'; '.join(differ)}"] if differ else []


def plain_problems(plain, last: int) -> list[str]:
    """The plain /generate answer the others are held to, held to the witness's chain itself: ids, text and
    completion_tokens."""
    want = chain(last, MAX_NEW_TOKENS, VOCAB)
    text = "".join(token_text(t) for t in want)
    out = []
    if plain.output_ids != want or plain.meta.get("completion_tokens") != MAX_NEW_TOKENS:
        out.append(
            f"{plain.label}: output_ids {plain.output_ids[:6]}... ({len(plain.output_ids)}, completion_tokens "
            f"{plain.meta.get('completion_tokens')}) are not the chain {want[:6]}... ({MAX_NEW_TOKENS})"
        )
    if plain.response.get("text") != text:
        out.append(f"{plain.label}: text {plain.response.get('text')!r} != the chain's {text!r}")
    return out


def stream_problems(stream, plain) -> list[str]:
    """A /generate stream against the plain answer to the same prompt: successive events' output_ids each a prefix
    of the next, the last equal to the plain output_ids, text and completion_tokens equal, every spec_* field of the
    final meta_info equal."""
    evs = events(stream)
    if not evs:
        return [f"{stream.label}: no stream events"]
    out: list[str] = []
    prev: list[int] = []
    for i, e in enumerate(evs):
        ids = list(e.get("output_ids") or [])
        if ids[: len(prev)] != prev:
            out.append(f"{stream.label}: event {i}'s output_ids {ids[:8]}... do not extend event {i - 1}'s")
            break
        prev = ids
    if prev != plain.output_ids:
        out.append(
            f"{stream.label}: the last event's output_ids ({len(prev)}) != the plain answer's ({len(plain.output_ids)})"
        )
    if stream.response.get("text") != plain.response.get("text"):
        out.append(
            f"{stream.label}: streamed text {stream.response.get('text')!r} != plain {plain.response.get('text')!r}"
        )
    keys = sorted(k for k in set(stream.meta) | set(plain.meta) if k.startswith("spec_") or k == "completion_tokens")
    differ = [
        f"{k} {stream.meta.get(k)} != {plain.meta.get(k)}" for k in keys if stream.meta.get(k) != plain.meta.get(k)
    ]
    if differ:
        out.append(f"{stream.label}: final meta_info against the plain answer: {'; '.join(differ)}")
    return out


def own_problems(exchanges, release_has_spec_details: bool | None = None) -> list[str]:
    """Every check that needs one server only (``release_has_spec_details``: default from the installed sglang)."""
    has = has_spec_details() if release_has_spec_details is None else release_has_spec_details
    by = {x.label: x for x in exchanges}
    failed = [f"{x.label}: request failed: {x.error}" for x in exchanges if x.error]
    if failed:
        return failed
    out = []
    for last in LASTS:
        plain = by[f"plain-{last}"]
        out += plain_problems(plain, last)
        out += stream_problems(by[f"stream-{last}"], plain)
        for label in (f"completions-{last}", f"completions-stream-{last}"):
            text, tokens = openai_text(by[label]), usage_tokens(by[label])
            if text != plain.response.get("text"):
                out.append(f"{label}: text {text!r} != /generate's {plain.response.get('text')!r}")
            if tokens != plain.meta.get("completion_tokens"):
                out.append(
                    f"{label}: usage.completion_tokens {tokens} != /generate's {plain.meta.get('completion_tokens')}"
                )
            out += spec_detail_problems(by[label], plain, has)
    chat, chat_stream = by["chat"], by["chat-stream"]
    if not openai_text(chat):
        out.append(f"chat: no message content ({openai_text(chat)!r}) for {MAX_NEW_TOKENS} tokens asked")
    if openai_text(chat_stream) != openai_text(chat):
        out.append(f"chat-stream: deltas {openai_text(chat_stream)!r} != the unstreamed content {openai_text(chat)!r}")
    mtp = any("spec_verify_ct" in x.meta for x in exchanges if x.label.startswith("plain-"))
    if has and mtp and (spec_details(chat) is None or spec_details(chat) != spec_details(chat_stream)):
        out.append(f"chat: spec_tokens_details {spec_details(chat)} / streamed {spec_details(chat_stream)}")
    if usage_tokens(chat_stream) != usage_tokens(chat) or usage_tokens(chat) != MAX_NEW_TOKENS:
        out.append(
            f"chat: usage.completion_tokens {usage_tokens(chat)} / streamed {usage_tokens(chat_stream)}, asked {MAX_NEW_TOKENS}"
        )
    return out


def against_reference(exchanges, reference) -> list[str]:
    """Texts and ids against the no-MTP server's answers of the same labels."""
    out = reference_gaps(exchanges, reference)
    for x, r in both_answered(exchanges, reference):
        mine = openai_text(x) if x.label.startswith(("completions", "chat")) else x.response.get("text")
        theirs = openai_text(r) if x.label.startswith(("completions", "chat")) else r.response.get("text")
        if mine != theirs or x.output_ids != r.output_ids:
            out.append(
                f"{x.label}: text {mine!r} (ids {x.output_ids[:6]}) != no-MTP {theirs!r} (ids {r.output_ids[:6]})"
            )
    return out
