"""Your own model, your rows, your reward: the settings that point the `pipeline` workflow at them.

    make real-model       # or any local HF folder with safetensors weights, a tokenizer and a chat template
    .venv/bin/pyflyte run workflows/pipeline.py pipeline --recipe small_instruct_cpu \\
        --overrides "$(.venv/bin/python examples/own_model/overrides.py)"
    .venv/bin/python examples/own_model/overrides.py --model /path/to/your/model    # another folder

What each setting does (docs/own-model.md has the whole walk-through, docs/settings.md every setting):
- `data`: no built-in task; train rows from train.jsonl and the eval split exactly as eval.jsonl gives it, each row a
  `prompt` and the reference `answer` (schema `prompt_answer`); the model's own chat template renders them.
- `model.base_path`: the folder; `sft.enabled` false: RL (GRPO) starts from it directly.
- `reward`: the function `number_then_brevity` of rewards/numreward.py, found through `reward.python_path` (user
  code is imported by path, never evaluated from a string); it runs in a limited process of its own.
- `eval`: greedy only, 16 new tokens (the answers are short).
small_instruct_cpu's other settings (learning rate, batch, steps) stay; `--recipe small_instruct_lora_cpu` trains
LoRA adapters instead of every weight. tests/integration/test_real_model_rl.py runs this example at tiny size (two
RL steps) in `make test`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def overrides(model_dir: str | Path) -> dict:
    """The example's settings for the model folder `model_dir` (absolute paths, so the command runs from anywhere)."""
    return {"data": {"task": "", "files": [str(HERE / "train.jsonl")], "schema": "prompt_answer",
                     "eval_files": [str(HERE / "eval.jsonl")], "eval_size": 0},
            "model": {"base_path": str(model_dir)},
            "sft": {"enabled": False},
            "eval": {"k": 0, "max_new_tokens": 16, "num_problems": 0},
            "reward": {"fn": "numreward:number_then_brevity", "python_path": [str(HERE / "rewards")]}}


def main() -> None:
    from posttrain.models.smollm2 import default_dir

    default = default_dir()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(default), help=f"the model folder (default: {default}, `make real-model`)")
    print(json.dumps(overrides(ap.parse_args().model)))


if __name__ == "__main__":
    main()
