"""The chat template, in one place: a prompt or messages -> the token ids the model continues from."""
from __future__ import annotations

from ..errors import check


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template. transformers returns a list or,
    in newer versions, a BatchEncoding; both become a plain list. A tokenizer without a template
    (a base model, a bare local folder) reads the turns as plain text, one "role: text" line each,
    so a conversation still decodes rather than failing inside transformers."""
    if not getattr(tokenizer, "chat_template", None):
        text = "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)
        return list(tokenizer(text + ("\nassistant:" if add_generation_prompt else ""),
                              add_special_tokens=True)["input_ids"])
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def prompt_ids(tokenizer, prompt: str | None = None, messages: list | None = None, raw: bool = False) -> list[int]:
    """A user's prompt (one user turn) or a list of chat messages as token ids; `raw` (or a
    tokenizer without a chat template) takes the prompt's text as it is."""
    if messages is None:
        check(isinstance(prompt, str) and prompt.strip() != "", "The prompt is empty: type something first.")
        if raw or not getattr(tokenizer, "chat_template", None):
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        messages = [{"role": "user", "content": prompt}]
    check(len(messages) > 0 and all(isinstance(m, dict) and str(m.get("content", "")).strip()
                                    for m in messages), "Every chat message needs some text.")
    return chat_ids(tokenizer, messages)
