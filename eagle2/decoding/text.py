"""The answer's text as it grows, an observer of the decoder's steps: each step decodes only its
new tokens, with tokenizers' DecodeStream (the incremental detokenizer of vLLM and TGI), instead
of the whole answer again. A token that ends inside a multi-byte character (an emoji, a CJK
character split by byte-level BPE) adds nothing until the tokens that complete it arrive; an
answer that ends there ends as a full decode does (with U+FFFD), through `finish`.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

WINDOW = 5   # tokens decoded before the unfinished tail, for the spaces and merges across its start


class TextStream:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._shown = 0                 # tokens whose text has been handed out
        self._parts: list[str] = []

    def push(self, ids: list[int]) -> str:
        """Add a step's tokens; returns how the text grew (nothing while a character is unfinished)."""
        if not ids:
            return ""
        self._ids += ids
        delta = self._stream.step(self._tokenizer.backend_tokenizer, list(ids))
        if delta is None:
            return ""
        self._shown = len(self._ids)
        return self._add(delta)

    def finish(self) -> str:
        """The answer ended: the text of an unfinished tail, as a full decode renders it."""
        if self._shown == len(self._ids):
            return ""
        w = max(0, self._shown - WINDOW)
        before = self._tokenizer.decode(self._ids[w:self._shown], skip_special_tokens=True)
        after = self._tokenizer.decode(self._ids[w:], skip_special_tokens=True)
        self._shown = len(self._ids)
        return self._add(after[len(before):])

    def _add(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        return "".join(self._parts)
