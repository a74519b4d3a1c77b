"""Reading and writing the dataset artifact's structured examples (one canonical JSON object per line).

An example is {"messages": [{"role", "content"}...], "answer": str | None, "task": str | None,
"columns": {name: JSON value}}: "columns" holds the source row's other columns ({} for built-in tasks; a
dataset written without it reads as {})."""

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


def read_examples(dataset_dir: str | Path, split: str) -> list[dict]:
    path = Path(dataset_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"dataset split {split!r} not found: {path}")
    with open(path, encoding="utf-8") as f:
        examples = [json.loads(line) for line in f if line.strip()]
    for ex in examples:  # datasets written before extra columns were kept have none
        ex.setdefault("columns", {})
    return examples


def prompt_messages(example: dict) -> list[dict]:
    """The conversation up to (not including) a final assistant turn: what the model is asked."""
    msgs = example["messages"]
    return msgs[:-1] if msgs and msgs[-1]["role"] == "assistant" else list(msgs)


def completion_text(example: dict) -> str | None:
    msgs = example["messages"]
    return msgs[-1]["content"] if msgs and msgs[-1]["role"] == "assistant" else None
