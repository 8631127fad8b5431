"""The target's tokenizer class: the generic fast class where AutoTokenizer would give that very
tokenizer (read without importing transformers' model code), AutoTokenizer everywhere else."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle2.errors import UserError
from eagle2.model.tokenizer import load_tokenizer, reads_as_generic

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["Write a haiku about the sea.", "def f(x):\n    return x ** 2  # héllo wörld 日本語 🙂",
         "  leading and trailing  ", "<|im_start|>user\nhi<|im_end|>", "", "1234567890 3.14159"]
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name three rivers."}]


def folder_with(tmp_path, name: str, tok_cfg: dict | None, model_type: str = "llama", tokenizer_json: bool = True):
    f = tmp_path / name
    f.mkdir()
    (f / "config.json").write_text(json.dumps({"model_type": model_type}))
    if tok_cfg is not None:
        (f / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    if tokenizer_json:
        (f / "tokenizer.json").write_text("{}")
    return f


def test_the_generic_class_only_where_autotokenizer_would_keep_it(tmp_path):
    generic = {"tokenizer_class": "TokenizersBackend"}
    assert reads_as_generic(folder_with(tmp_path, "a", generic))
    assert reads_as_generic(folder_with(tmp_path, "b", {"tokenizer_class": "PreTrainedTokenizerFast"}, "qwen2"))
    assert not reads_as_generic(folder_with(tmp_path, "c", {"tokenizer_class": "LlamaTokenizerFast"}))
    assert not reads_as_generic(folder_with(tmp_path, "d", {**generic, "auto_map": {"AutoTokenizer": ["x", "y"]}}))
    assert not reads_as_generic(folder_with(tmp_path, "e", generic, "mistral"))     # tekken may apply
    assert not reads_as_generic(folder_with(tmp_path, "f", generic, tokenizer_json=False))
    assert not reads_as_generic(folder_with(tmp_path, "g", None))


def test_a_folder_without_a_tokenizer_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="No usable tokenizer"):
        load_tokenizer(folder_with(tmp_path, "none", None, tokenizer_json=False))
    with pytest.raises(UserError, match="No usable tokenizer"):                 # a broken tokenizer.json
        load_tokenizer(folder_with(tmp_path, "broken", {"tokenizer_class": "TokenizersBackend"}))


def test_the_default_model_reads_the_same_tokenizer_either_way(real_folder):
    from transformers import AutoTokenizer
    assert reads_as_generic(real_folder)
    ours, auto = load_tokenizer(real_folder), AutoTokenizer.from_pretrained(str(real_folder))
    assert type(ours) is type(auto)
    for t in TEXTS:
        assert ours(t)["input_ids"] == auto(t)["input_ids"], t
    for gen in (True, False):
        assert (ours.apply_chat_template(CHAT, add_generation_prompt=gen, tokenize=True)
                == auto.apply_chat_template(CHAT, add_generation_prompt=gen, tokenize=True))
    ids = list(range(0, 49152, 7)) + ours.all_special_ids
    assert ours.batch_decode([[i] for i in ids]) == auto.batch_decode([[i] for i in ids])
    assert ours.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id", "all_special_ids",
                 "chat_template", "model_max_length", "padding_side"):
        assert getattr(ours, attr) == getattr(auto, attr), attr


def test_reading_the_default_tokenizer_imports_no_model_code(real_folder):
    """AutoTokenizer reads the model's config through transformers' model code, which pulls in
    torch.distributed and sympy (87 MiB resident, about 2 s); the generic class needs none of it."""
    code = ("import sys; from pathlib import Path; from eagle2.model.tokenizer import load_tokenizer; "
            f"load_tokenizer(Path({str(real_folder)!r})); "
            "print(sorted(m for m in ('transformers.models.llama.configuration_llama', 'sympy', "
            "'torch.distributed.tensor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_the_token_table_holds_each_tokens_text(real_folder):
    """One string with offsets (a page holds it for the model's life), read back as the
    tokenizer decodes each token alone; an id outside the vocabulary reads "<id>"."""
    from eagle2.model.loading import TokenTexts
    tok = load_tokenizer(real_folder)
    table = TokenTexts(tok, 49152)
    assert len(table) == 49152
    ids = list(range(0, 49152, 5)) + [49151, 0, 1]
    assert table.texts(ids) == tok.batch_decode([[i] for i in ids])
    assert table.texts([-1, 49152, 3]) == ["<-1>", "<49152>", tok.decode([3])]
    assert table.texts([]) == []
