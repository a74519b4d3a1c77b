"""Your own environment with tools, your demonstrations: the settings that point `agent_pipeline` at them.

    .venv/bin/pyflyte run workflows/pipeline.py agent_pipeline --recipe tiny_calculator \\
        --overrides "$(.venv/bin/python examples/tool_env/overrides.py)"
    .venv/bin/python examples/tool_env/make_data.py     # after changing parts.csv or the questions: new JSONL rows

The environment is warehouse.py's `Warehouse`: a stock table (parts.csv) behind two tools, `stock(part)` and
`shelf(part)`. The questions ask about a part; only the tools know the answer. The pipeline runs data -> SFT on the
demonstrated episodes -> evaluation in the environment -> RL (GRPO) in the environment -> evaluation in the
environment, every stage cached and in lineage.

What each setting does (docs/agents.md has the conventions, docs/settings.md every setting):
- `data`: no built-in task; train rows from train.jsonl and the eval split exactly as eval.jsonl gives it (parts
  the train rows never ask about), each row a whole episode (schema `messages`): question, tool call, tool
  response, answer. `answer_marker` "####": the reference answer is the last turn's text after it, and the
  verifier reads the model's answer the same way. `system_prompt`: the tools block the episodes show (made from
  the environment's own tool schemas), so SFT trains on the tokens RL and the evaluation sample.
  `demo_error_rate` 0: the recipe's sloppy teacher is the calculator task's; these demonstrations are the user's.
- `rl.environment` / `eval.environment`: the class by import path "module:Class", imported in the sandboxed tool
  process from `episode.python_path` (this folder), never in the trainer and never evaluated from a string; its
  source hash keys the RL and eval caches and is in the RL model's lineage (`extra.environment`).
- `sft.steps` 300: the tiny model learns the call format, which tool a question needs and to copy a part number and
  a result (measured: greedy 1.000 on the 40 held-out problems, 2.3 steps/s on 2 cores). The teacher here always
  calls the right tool, so RL has little to add on this task (every sampled episode is rewarded 1); with
  demonstrations that sometimes skip the tool or pick the wrong one, RL in the environment is what corrects it.
- `rl.steps` 20 (the recipe's 100 are the calculator's): 20 GRPO steps of 64 prompts x 8 episodes in the
  environment, enough to see the loop on this task; raise it for a task where RL has something to teach.
tiny_calculator's other settings stay: the embedded 0.6M-parameter model built from scratch with a tokenizer that
merges across words (the tools block every episode opens with becomes a few tokens), its episode limits
(3 turns, 16 new tokens a turn, 64 an episode) and its other RL settings. tests/integration/test_tool_env_example_e2e.py
runs this example at tiny size (fewer SFT steps, 2 RL steps) in `make test`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENVIRONMENT = "warehouse:Warehouse"
"""The environment by import path: module `warehouse` in this folder, class `Warehouse`."""


def tools_block() -> str:
    """The system turn that shows the model the environment's tools, exactly as an episode renders it."""
    import importlib.util

    from posttrain.envs.calls import tools_block as block
    from posttrain.envs.tools import environment_tools

    spec = importlib.util.spec_from_file_location("warehouse", HERE / "warehouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return block(environment_tools(module.Warehouse))


def overrides(sft_steps: int = 300) -> dict:
    """The example's settings (absolute paths, so the command runs from anywhere)."""
    episode = {"python_path": [str(HERE)]}
    return {"data": {"task": "", "files": [str(HERE / "train.jsonl")], "schema": "messages",
                     "eval_files": [str(HERE / "eval.jsonl")], "eval_size": 0, "answer_marker": "####",
                     "system_prompt": tools_block(), "demo_error_rate": 0.0},
            "sft": {"steps": sft_steps},
            "rl": {"environment": ENVIRONMENT, "episode": episode, "steps": 20},
            "eval": {"environment": ENVIRONMENT, "episode": episode, "num_problems": 0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=300, help="SFT steps on the demonstrations (default: 300)")
    print(json.dumps(overrides(ap.parse_args().sft_steps)))


if __name__ == "__main__":
    main()
