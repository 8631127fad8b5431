"""The target's tokenizer, loaded by the class that reads its files as they are meant.

`AutoTokenizer` decides the class from the model's config, and to read that config it imports
transformers' model code (torch.distributed, sympy, dynamo: about 1,000 modules, 87 MiB resident and
2 s at start-up, measured in benchmarks/app-memory). Where the tokenizer's own config names the
generic fast class, for a model type whose tokenizer transformers does not override, that class
reads tokenizer.json directly and gives the same tokenizer; anything else (a model-specific class,
custom code, a model type with known-wrong hub classes) goes through AutoTokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError

# the class names that mean "tokenizer.json as it is" (transformers 5 names it TokenizersBackend)
GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
# model types whose declared generic class AutoTokenizer keeps (it swaps in its own class for
# some others, e.g. Mistral's tekken format), among those this project loads
GENERIC_MODEL_TYPES = {"llama", "qwen2"}


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def reads_as_generic(folder: Path) -> bool:
    """Whether the generic fast class is the tokenizer AutoTokenizer would give for `folder`."""
    tok_cfg = _json(folder / "tokenizer_config.json")
    return (tok_cfg.get("tokenizer_class") in GENERIC_CLASSES and "auto_map" not in tok_cfg
            and (folder / "tokenizer.json").is_file()
            and _json(folder / "config.json").get("model_type") in GENERIC_MODEL_TYPES)


def load_tokenizer(folder: Path):
    """The tokenizer of the model in `folder`; a UserError where there is none usable."""
    try:
        if reads_as_generic(folder):
            from transformers import PreTrainedTokenizerFast
            return PreTrainedTokenizerFast.from_pretrained(str(folder))
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001  (any reader's failure is the same fact for the user)
        raise UserError(f"No usable tokenizer in {folder} ({type(e).__name__}).") from None
