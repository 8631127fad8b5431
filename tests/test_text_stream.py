"""The answer's text grows by decoding only each step's new tokens (eagle2/decoding/text.py): at
any point where a character is complete it equals a full decode of the answer, for the real
byte-level BPE tokenizer on text with multi-byte characters, emoji and runs of spaces, and for
the tiny word-level one; a decoder's steps never decode the whole answer again."""
from __future__ import annotations

import random

import pytest

from eagle2.decoding.decoder import Decoder
from eagle2.decoding.text import TextStream
from eagle2.model.loading import load_bundle

TEXTS = [
    "Héllo  wörld — naïve café, 10 °C.\n\n   indented line\ttab",
    "Emoji: 🎉👍🏽 👨‍👩‍👧 ❤️ and CJK 中文字符 日本語 한국어 in one line.",
    "  leading spaces, trailing spaces   ",
]


def chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    """ids cut into steps of 1 to 5 tokens, as speculative cycles emit them."""
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i:i + n])
        i += n
    return out


def streamed(tokenizer, steps: list[list[int]]) -> tuple[str, list[str]]:
    """The text of an answer that ends after `steps`, and how each step grew it."""
    ts = TextStream(tokenizer)
    deltas = [ts.push(s) for s in steps]
    deltas[-1] += ts.finish()
    assert "".join(deltas) == ts.text
    return ts.text, deltas


@pytest.fixture(scope="module")
def real_tokenizer(real_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(real_folder))


@pytest.mark.parametrize("seed", range(4))
def test_incremental_text_equals_a_full_decode_real_tokenizer(real_tokenizer, seed):
    tok = real_tokenizer
    eos = tok.eos_token_id
    ids = []
    for t in TEXTS:
        ids += tok.encode(t, add_special_tokens=False) + [eos]   # special tokens are skipped, as in the answer
    rng = random.Random(seed)
    steps = chunks(ids, rng) if seed else [[i] for i in ids]
    text, deltas = streamed(tok, steps)
    assert text == tok.decode(ids, skip_special_tokens=True)
    # an answer that ends after any step, inside a character or not, reads as its full decode
    cut = 0
    for i in range(len(steps)):
        n = sum(map(len, steps[:i + 1]))
        full = tok.decode(ids[:n], skip_special_tokens=True)
        cut += full.endswith("\ufffd")
        assert streamed(tok, steps[:i + 1])[0] == full
    assert cut > 0 or seed > 0    # token by token, some answers end inside an emoji


def test_incremental_text_equals_a_full_decode_word_tokenizer(tiny_target):
    from transformers import AutoTokenizer
    folder, _ = tiny_target("text", vocab=40)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = [3, 7, 0, 12, 39, 1, 1, 0, 25]   # 0 is <unk>, a special token
    text, _ = streamed(tok, chunks(ids, random.Random(1)))
    assert text == tok.decode(ids, skip_special_tokens=True)


def test_a_decoder_decodes_only_new_tokens(tiny_target, monkeypatch):
    folder, _ = tiny_target("text", vocab=40)
    b = load_bundle(target=str(folder), head="random")
    d = Decoder(b, "eagle2", max_new_tokens=30, total_tokens=6, depth=2, top_k=3)
    d.start(input_ids=[3, 5, 8, 13])
    decoded = []
    real = type(b.tokenizer).decode
    monkeypatch.setattr(type(b.tokenizer), "decode", lambda self, ids, **kw: decoded.append(ids) or real(self, ids, **kw))
    d.generate()
    assert decoded == []                            # no Step decoded the answer again
    assert len(d.trace.steps) > 2
    full = real(b.tokenizer, d.generated, skip_special_tokens=True)
    assert d.text == full == "".join(s.text_delta for s in d.trace.steps)
