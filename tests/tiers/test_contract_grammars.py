"""Contract tier: the structured-output family's grammars (mtpmatrix.tiers.surface.structured) compile with the
grammar backend this sglang release installs (xgrammar, sglang's default) over the tiny pairs' tokenizer, and the
family's predictions hold for that backend: at every position of the witness's greedy walk either its peak token
(next = token + 1) is allowed, or exactly one character is (its ASCII token and byte-fallback twin), and the walk
ends in the predicted text with only stop tokens left. Runs on CPU, so a release whose backend cannot read the
tiny tokenizer, or whose grammar allows what the prediction does not expect, says so before any GPU is spent."""

from __future__ import annotations

import pytest

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.tiers.surface import structured

pytestmark = pytest.mark.contract

VOCAB = 512


def walk(compiler, case, xgr, torch) -> str:
    """The witness's greedy walk under ``case``'s grammar: its text, or CheckFailure where the prediction fails."""
    compile_ = {
        "regex": compiler.compile_regex,
        "ebnf": compiler.compile_grammar,
        # what sglang's XGrammarGrammarBackend.dispatch_json does (any_whitespace=True, its default)
        "json_schema": lambda g: compiler.compile_json_schema(g, any_whitespace=True),
    }[case.kind]
    matcher = xgr.GrammarMatcher(compile_(case.grammar))
    mask = xgr.allocate_token_bitmask(1, VOCAB)
    x, text = structured._first(case.text[0]), ""
    for _ in range(structured.MAX_NEW_TOKENS):
        matcher.fill_next_token_bitmask(mask)
        logits = torch.zeros((1, VOCAB))
        xgr.apply_token_bitmask_inplace(logits, mask)
        allowed = set((logits[0] > float("-inf")).nonzero().flatten().tolist())
        peak = (x + 1) % VOCAB
        chars = {structured.fold(t) for t in allowed} - set(structured.STOP_IDS)
        if peak in allowed:
            token = peak
        elif not chars and allowed <= set(structured.STOP_IDS):
            return text
        elif len(chars) == 1:
            token = chars.pop()
        else:
            raise CheckFailure(
                "config",
                f"{case.label}: after {text!r} the grammar allows {len(chars)} characters and not the witness's "
                f"peak {structured.decode([peak])!r}: the output is not predicted",
            )
        if not matcher.accept_token(token):
            raise CheckFailure("config", f"{case.label}: the matcher refused token {token} it allowed")
        text += structured.decode([token])
        x = token
    raise CheckFailure("config", f"{case.label}: no end within {structured.MAX_NEW_TOKENS} tokens: {text!r}")


@pytest.mark.check("config")
@pytest.mark.parametrize("label", [c.label for c in structured.CASES])
def test_structured_grammar_predicted(label, record_property):
    """One structured-output request's grammar, compiled as sglang compiles it over the tiny tokenizer
    (TokenizerInfo.from_huggingface with the model's EOS ids as stop tokens), walked greedily as the witness
    decodes: the text the family predicts, valid under the grammar, ended by stop tokens only."""
    xgr = pytest.importorskip("xgrammar", reason="no xgrammar in this environment (sglang installs it)")
    torch = pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    from mtpmatrix.pairs.tiny.vocab import make_tokenizer

    case = next(c for c in structured.CASES if c.label == label)
    try:  # what sglang's XGrammarGrammarBackend does with the model's tokenizer and EOS ids
        info = xgr.TokenizerInfo.from_huggingface(
            make_tokenizer(), vocab_size=VOCAB, stop_token_ids=list(structured.STOP_IDS)
        )
    except Exception as exc:  # noqa: BLE001 - any refusal of the tokenizer is this check's finding
        raise CheckFailure("config", f"xgrammar cannot read the tiny tokenizer: {type(exc).__name__}: {exc}") from None
    record_property("vocab_type", str(info.vocab_type))
    text = walk(xgr.GrammarCompiler(info), case, xgr, torch)
    record_property("text", text)
    if text != case.text:
        raise CheckFailure("config", f"{label}: the walk gives {text!r}, the family predicts {case.text!r}")
