"""The tiny pairs' vocabulary: Gemma's fixed low ids, then the multimodal / chat markers, then 256 byte-fallback
tokens, then printable ASCII (one token a character), padded with unused tokens to ``VOCAB``; the tokenizer and the
processor every pair's folder carries (sglang needs them even with --skip-tokenizer-init)."""

from __future__ import annotations

from pathlib import Path

VOCAB = 512

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<|image>": 4,
    "<image|>": 5,
    "<|image|>": 6,
    "<|video|>": 7,
    "<|audio>": 8,
    "<audio|>": 9,
    "<|audio|>": 10,
    "<|turn>": 11,
    "<turn|>": 12,
    "<mask>": 13,
}
MM_TOKEN_IDS = {
    "boi_token_id": 4,
    "eoi_token_id": 5,
    "image_token_id": 6,
    "video_token_id": 7,
    "boa_token_id": 8,
    "eoa_token_index": 9,
    "eoa_token_id": 9,
    "audio_token_id": 10,
}
END_OF_TURN_ID = 12
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def make_tokenizer():
    """A byte-fallback char-level tokenizer covering printable ASCII, with Gemma's special tokens."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = dict(SPECIAL_TOKENS)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab.setdefault(c, len(vocab))
    i = 0
    while len(vocab) < VOCAB:
        vocab[f"<unused{i}>"] = len(vocab)
        i += 1
    assert len(vocab) == VOCAB, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
            "sot_token": "<|turn>",
            "eot_token": "<turn|>",
        },
    )


def save_processor(tokenizer, folder: Path) -> None:
    """A Gemma4Processor (image processor, audio feature extractor, video processor, chat template) into ``folder``."""
    from transformers.models.gemma4 import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    proc = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    proc.save_pretrained(folder)
