"""Writes the example's demonstrations (train.jsonl) and held-out problems (eval.jsonl) from the warehouse's
table, each row a whole episode as the pipeline renders it: the question, the tool call in the documented format
(`posttrain.envs.calls.render_call`), the tool's result as a tool-response turn, the answer after "####". The
results are the environment's own (its tools called here), so SFT trains on exactly what RL and the evaluation
then see; the system turn with the tools is added by `data.system_prompt` (overrides.py), not repeated per row.

    .venv/bin/python examples/tool_env/make_data.py      # rewrites train.jsonl and eval.jsonl next to it

The last EVAL_PARTS parts of the table (in a fixed shuffled order) are held out: the evaluation asks about parts
the model never saw, so it must copy the part number into its call, not recall an answer. A held-out row keeps its
whole episode (the reference answer is its "####" text); the evaluation plays only the turns before the first
assistant turn.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from warehouse import Warehouse  # this folder: the script's own, first on sys.path when it runs

from posttrain.envs.calls import render_call, response_turn
from posttrain.envs.host import as_text

HERE = Path(__file__).resolve().parent
EVAL_PARTS = 20
QUESTIONS = {"stock": ["How many units of part {part} are in stock?", "Stock of part {part}?"],
             "shelf": ["Which shelf is part {part} on?", "Where is part {part} stored?"]}
"""Two phrasings per tool: the model learns which tool a question needs from its words."""


def episode(tool: str, question: str, part: str, env) -> dict:
    """One demonstration: ask, call `tool` on `part`, read its result, answer with it."""
    result = as_text(getattr(env, tool)(part))
    return {"messages": [{"role": "user", "content": question.format(part=part)},
                         {"role": "assistant", "content": render_call(tool, {"part": part})},
                         response_turn(result),
                         {"role": "assistant", "content": f"#### {result}"}]}


def rows() -> tuple[list[dict], list[dict]]:
    """(train rows: every part but the held-out ones, each tool, each phrasing; eval rows: the held-out parts,
    each tool once, phrasings alternating)."""
    env = Warehouse()
    parts = sorted(env._table)
    random.Random("tool-env-split").shuffle(parts)
    train_parts, eval_parts = parts[:-EVAL_PARTS], parts[-EVAL_PARTS:]
    train = [episode(tool, q, p, env) for p in train_parts for tool, qs in QUESTIONS.items() for q in qs]
    held = [episode(tool, qs[i % 2], p, env) for i, p in enumerate(eval_parts) for tool, qs in QUESTIONS.items()]
    return train, held


def write(out_dir: Path = HERE) -> None:
    for name, data in zip(("train.jsonl", "eval.jsonl"), rows(), strict=True):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in data))


if __name__ == "__main__":
    write()
