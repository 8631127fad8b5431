"""The chat template, in one place: messages -> the token ids the model continues from."""
from __future__ import annotations


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template. transformers returns a list or,
    in newer versions, a BatchEncoding; both become a plain list."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)
