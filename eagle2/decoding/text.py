"""The answer's text as it grows, an observer of the decoder's steps: each step decodes only its
new tokens, with tokenizers' DecodeStream (the incremental detokenizer of vLLM and TGI), instead
of the whole answer again. A token that ends inside a multi-byte character (an emoji, a CJK
character split by byte-level BPE) adds nothing until the tokens that complete it arrive.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream


class TextStream:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer.backend_tokenizer   # the fast tokenizer's Rust half
        self._stream = DecodeStream(skip_special_tokens=True)
        self._parts: list[str] = []

    def push(self, ids: list[int]) -> str:
        """Add a step's tokens; returns how the text grew."""
        delta = (self._stream.step(self._tokenizer, list(ids)) if ids else None) or ""
        if delta:
            self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        return "".join(self._parts)
