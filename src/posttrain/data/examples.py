"""Reading and writing the dataset artifact's structured examples (one canonical JSON object per line).

An example is {"messages": [{"role", "content"}...], "answer": str | None, "task": str | None,
"columns": {name: JSON value}}: "columns" holds the source row's other columns ({} for built-in tasks; a
dataset written without it reads as {}).

A preference example (`data.schema: "preference"`, for DPO and reward models) has two more keys:

    {"messages": [<prompt turns, never ending with an assistant turn>],
     "chosen":   [<turns>],      # the preferred continuation of the prompt (one or more assistant turns)
     "rejected": [<turns>],      # the dispreferred continuation, never equal to "chosen"
     "answer": str | None, "task": str | None, "columns": {...}}

"messages" is then only the prompt, so `prompt_messages` works unchanged; `pair_conversations` gives the two
full conversations (prompt + each continuation)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def dumps(example: dict) -> str:
    return json.dumps(example, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: Path, examples: Iterable[dict]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for ex in examples:
            f.write(dumps(ex) + "\n")
            n += 1
    return n


def write_dataset(out_dir: Path, train: Iterable[dict], eval_: Iterable[dict], info: dict, *,
                  more: dict[str, Iterable[dict]] | None = None) -> None:
    """A dataset folder (`train.jsonl`, `eval.jsonl`, `info.json`, and `<name>.jsonl` for each of `more`) written
    into a sibling staging folder and renamed into place, so a failure leaves nothing half-written. `out_dir`
    must be absent or empty."""
    import os
    import shutil
    import tempfile

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir.parent))
    try:
        write_jsonl(stage / "train.jsonl", train)
        write_jsonl(stage / "eval.jsonl", eval_)
        for name, rows in (more or {}).items():
            write_jsonl(stage / f"{name}.jsonl", rows)
        (stage / "info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_examples(dataset_dir: str | Path, split: str) -> list[dict]:
    path = Path(dataset_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"dataset split {split!r} not found: {path}")
    with open(path, encoding="utf-8") as f:
        examples = [json.loads(line) for line in f if line.strip()]
    for ex in examples:  # datasets written before extra columns were kept have none
        ex.setdefault("columns", {})
    return examples


def is_preference(example: dict) -> bool:
    """True for a preference example (prompt turns + "chosen" and "rejected" continuations)."""
    return "chosen" in example and "rejected" in example


def pair_conversations(example: dict) -> tuple[list[dict], list[dict]]:
    """(chosen conversation, rejected conversation) of a preference example: its prompt turns followed by
    each continuation."""
    if not is_preference(example):
        raise ValueError("not a preference example (it has no 'chosen' and 'rejected' turns)")
    prompt = list(example["messages"])
    return prompt + example["chosen"], prompt + example["rejected"]


def prompt_messages(example: dict) -> list[dict]:
    """The conversation up to (not including) a final assistant turn: what the model is asked (a preference
    example's "messages", which hold only the prompt)."""
    msgs = example["messages"]
    return msgs[:-1] if msgs and msgs[-1]["role"] == "assistant" else list(msgs)


def episode_prompt(example: dict) -> list[dict]:
    """The turns before the first assistant turn: an episode's prompt (the environment and the policy play the
    rest). For a single-turn example it is `prompt_messages`; a multi-turn demonstration (tool calls and their
    results) is a whole episode, and only its opening turns are the question."""
    msgs = example["messages"]
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
    return list(msgs[:first])


def completion_text(example: dict) -> str | None:
    msgs = example["messages"]
    return msgs[-1]["content"] if msgs and msgs[-1]["role"] == "assistant" else None
