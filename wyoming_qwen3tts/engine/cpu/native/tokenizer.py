"""The Qwen3-TTS text tokenizer, rebuilt from a talker GGUF's vocabulary and merges.

The GGUF keeps the byte-level BPE vocabulary by id (``tokenizer.ggml.tokens``) and its
merges (``tokenizer.ggml.merges``). This builds, with the ``tokenizers`` library, the same
tokenizer transformers' ``Qwen2Tokenizer`` builds from ``vocab.json`` / ``merges.txt`` (what
qwen_tts's processor uses): NFC normalisation, Qwen2's pre-tokenising pattern, byte-level
BPE, and the added tokens matched whole. The added tokens are every token from
``<|endoftext|>`` on (the Qwen vocabulary's first added token: the BPE vocabulary ends just
before it), except the converter's ``<|unused_N|>`` placeholders for ids without a token.
"""

from __future__ import annotations

import re
from typing import Any

#: transformers' ``tokenization_qwen2.PRETOKENIZE_REGEX``.
PRETOKENIZE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
#: The first added token of the Qwen vocabulary.
FIRST_ADDED = "<|endoftext|>"
_PLACEHOLDER = re.compile(r"^<\|unused_\d+\|>$")


class TextTokenizer:
    """Text -> token ids, as qwen_tts tokenizes its prompt texts.

    Args:
        tokens: the vocabulary by id; merges: BPE merges as "left right" strings.

    Raises:
        ValueError: the vocabulary has no ``<|endoftext|>``.
    """

    def __init__(self, tokens: list[str], merges: list[str]) -> None:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import BPE

        try:
            first_added = tokens.index(FIRST_ADDED)
        except ValueError:
            raise ValueError(f"the text vocabulary has no {FIRST_ADDED}") from None
        vocab = {token: i for i, token in enumerate(tokens)}
        pairs = [(left, right) for left, _, right in (m.partition(" ") for m in merges)]
        tokenizer: Any = Tokenizer(BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False, byte_fallback=False))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRETOKENIZE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tokenizer.decoder = decoders.ByteLevel()
        added = [t for t in tokens[first_added:] if not _PLACEHOLDER.match(t)]
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
        self._tokenizer = tokenizer

    def ids(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added, as Qwen2's)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
