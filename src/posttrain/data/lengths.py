"""Token-length budget of a dataset, measured with the model's own tokenizer and chat template.

`check_budget` renders every example the way training and generation will (`encode_prompt` for prompts,
`encode_conversation` for whole SFT conversations: the ids `tokenize_for_training` trains on) and refuses - with a
ConfigError naming how many rows, the longest one and the setting to change - a budget that some rows cannot fit:
  - RL / eval (sft=False): prompt tokens + max_new_tokens must fit in model.max_seq_len, or the rollout
    could not generate a full-length completion;
  - SFT (sft=True): the whole conversation must fit in model.max_seq_len (the trainer would drop it).
It does not shorten or drop rows itself, and it does not know which stage calls it beyond `sft` and the
setting name the caller passes.

    report = check_budget(dataset_dir, tokenizer, max_seq_len=256, max_new_tokens=64, sft=False,
                          new_tokens_setting="rl.max_new_tokens", splits=("train",))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posttrain.config import ConfigError
from posttrain.data.chat import encode_conversation, encode_prompt
from posttrain.data.examples import is_preference, pair_conversations, prompt_messages, read_examples


@dataclass(frozen=True, kw_only=True)
class LengthReport:
    num_rows: int
    """Rows measured (over all checked splits)."""
    max_prompt_tokens: int
    """Longest prompt, rendered with the generation prompt (what the model continues from)."""
    mean_prompt_tokens: float
    max_conversation_tokens: int | None
    """Longest whole conversation (SFT only; None otherwise)."""
    total_conversation_tokens: int | None = None
    """All the conversations' tokens, what one pass over the rows puts through the model (SFT only: a preference
    pair counts both of its conversations; None otherwise). `sft.tokens` divides by it."""
    longest: str
    """Where the longest row is: "<split>.jsonl line N"."""
    max_seq_len: int
    max_new_tokens: int
    sft: bool
    splits: tuple[str, ...]


def _preview(example: dict, n: int = 60) -> str:
    text = prompt_messages(example)[-1]["content"] if prompt_messages(example) else ""
    text = " ".join(text.split())
    return repr(text[:n] + ("..." if len(text) > n else ""))


def check_budget(dataset_dir: str | Path, tokenizer, *, max_seq_len: int, max_new_tokens: int, sft: bool,
                 splits: tuple[str, ...] | None = None,
                 new_tokens_setting: str = "rl.max_new_tokens / eval.max_new_tokens") -> LengthReport:
    """Measure every row of `splits` (default: train for SFT, train and eval otherwise); raise ConfigError
    when a row does not fit the budget, else return the LengthReport."""
    splits = splits or (("train",) if sft else ("train", "eval"))
    rows = []  # (split, line, example, prompt tokens, longest conversation's tokens, all its tokens; None unless sft)
    for split in splits:
        for line, ex in enumerate(read_examples(dataset_dir, split), start=1):
            n_prompt = len(encode_prompt(tokenizer, prompt_messages(ex)))
            n_conv = n_all = None
            if sft:  # a preference pair: the longer of its two conversations must fit; both go through the model
                convs = pair_conversations(ex) if is_preference(ex) else [ex["messages"]]
                lens = [len(encode_conversation(tokenizer, c)) for c in convs]
                n_conv, n_all = max(lens), sum(lens)
            rows.append((split, line, ex, n_prompt, n_conv, n_all))
    if not rows:
        raise ConfigError(f"{dataset_dir}: no rows in split(s) {list(splits)} to measure")

    if sft:
        need = [r[4] for r in rows]
        what = "whole conversations (prompt + completion, which SFT trains on)"
    else:
        need = [r[3] + max_new_tokens for r in rows]
        what = f"prompts + {new_tokens_setting}={max_new_tokens} new tokens"
    worst = max(range(len(rows)), key=lambda i: (need[i], -i))  # first of the longest
    split, line, ex, n_prompt, _, _ = rows[worst]
    over = sum(n > max_seq_len for n in need)
    if over:
        if sft:
            detail, fix = f"{need[worst]} tokens", f"Raise model.max_seq_len to at least {need[worst]}"
        else:
            detail = f"{n_prompt} prompt tokens + {max_new_tokens} = {need[worst]}"
            fix = f"Raise model.max_seq_len to at least {need[worst]}"
            if n_prompt < max_seq_len:
                fix += f" or lower {new_tokens_setting} to at most {max_seq_len - n_prompt}"
        raise ConfigError(
            f"{over} of {len(rows)} rows ({', '.join(splits)}) do not fit model.max_seq_len={max_seq_len} as {what}; "
            f"the longest is {split}.jsonl line {line} ({detail}; prompt {_preview(ex)}). "
            f"{fix}, or shorten or drop the long rows in your data.")
    prompts = [r[3] for r in rows]
    return LengthReport(num_rows=len(rows), max_prompt_tokens=max(prompts),
                        mean_prompt_tokens=sum(prompts) / len(prompts),
                        max_conversation_tokens=max(r[4] for r in rows) if sft else None,
                        total_conversation_tokens=sum(r[5] for r in rows) if sft else None,
                        longest=f"{split}.jsonl line {line}", max_seq_len=max_seq_len,
                        max_new_tokens=max_new_tokens, sft=sft, splits=tuple(splits))
