"""Chat-template tokenisation with the model's OWN template.

`tokenize_for_training` finds the assistant spans by rendering prefixes of the conversation: the tokens
between `render(messages[:i], add_generation_prompt=True)` and `render(messages[:i+1])` are assistant
message i (its content and end-of-turn token). Only those get loss. This works for any template whose
rendering of a prefix is a prefix of the full rendering - true of the common chat formats; violating
templates raise a clear error instead of silently training on the prompt.
"""

from __future__ import annotations


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the prompt with the generation prompt appended (what the model continues from)."""
    return _encode(tokenizer, _render(tokenizer, messages, add_generation_prompt=True))


def encode_conversation(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the whole conversation as training sees it (no generation prompt): its length is what
    must fit model.max_seq_len."""
    return _encode(tokenizer, _render(tokenizer, messages, add_generation_prompt=False))


def tokenize_for_training(tokenizer, messages: list[dict], max_len: int) -> tuple[list[int], list[int]] | None:
    """(input_ids, loss_mask) with loss_mask 1 on assistant tokens only; None if longer than max_len (found
    before the prefixes are rendered: a row the trainer drops costs one encoding)."""
    ids = encode_conversation(tokenizer, messages)
    if len(ids) > max_len:
        return None
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_encode(tokenizer, _render(tokenizer, messages[:i], add_generation_prompt=True)))
        # the last message's prefix is the whole conversation, already encoded (the usual last assistant turn)
        end_ids = ids if i + 1 == len(messages) else encode_conversation(tokenizer, messages[: i + 1])
        if ids[: len(end_ids)] != end_ids:
            raise ValueError("the chat template does not render a conversation prefix as a prefix of the whole; "
                             "cannot locate assistant tokens for the loss mask")
        for t in range(start, len(end_ids)):
            mask[t] = 1
    return ids, mask
