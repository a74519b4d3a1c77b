"""Your own preference data -> SFT on the chosen answers -> DPO: the settings that point `dpo_pipeline` at them.

    .venv/bin/pyflyte run workflows/pipeline.py dpo_pipeline --recipe tiny_cpu \\
        --overrides "$(.venv/bin/python examples/preference_dpo/overrides.py)"
    make real-model       # then the same pairs on a pretrained model (SmolLM2-135M-Instruct or any local HF folder)
    .venv/bin/pyflyte run workflows/pipeline.py dpo_pipeline --recipe small_instruct_cpu \\
        --overrides "$(.venv/bin/python examples/preference_dpo/overrides.py --model default)"

What each setting does (docs/dense.md "## Data" has every form preference rows may take, docs/settings.md every
setting):
- `data`: no built-in task; the rows of pairs.jsonl, each a `prompt`, the `chosen` and the `rejected` answer
  (schema `preference`; TRL's conversational lists of messages work too) and, optionally, a reference `answer`
  that only the evaluation reads (its verifier: exact match). 8 rows are held out (`eval_size`). The data are the
  pairs: dpo_pipeline samples none (no `pairs` stage).
- `sft`: trains on prompt + chosen first, so DPO starts from (and is anchored to, as its reference) a model that
  already answers in the data's form; 100 steps of 16 rows for the tiny model built from scratch.
- `dpo`: 20 steps of 16 pairs (each pair's prompt goes through the model once); the recipe's loss, beta and
  `sft_weight` stay.
- `eval`: greedy accuracy on the held-out rows, 12 new tokens (an answer is a city's name). The tiny model built
  from scratch on 40 rows cannot know a held-out country's capital (0 before and after DPO); a pretrained one can.
- `model.max_seq_len` 48 (tiny_cpu: 32): a question, its answer and the chat template fit; `demo_error_rate` 0:
  tiny_cpu's sloppy addition teacher does not apply to files.
With `--model FOLDER` (or `--model default`: the folder `make real-model` builds) the settings start from that
model instead (`model.base_path`; run with `--recipe small_instruct_cpu`, whose SFT settings stay): DPO at lr 1e-6
in micro-batches of 4 pairs. tests/integration/test_dense_pipelines_e2e.py runs the tiny_cpu command as it is
(wandb off) in `make test`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def overrides(model_dir: str | Path | None = None) -> dict:
    """The example's settings (absolute paths, so the command runs from anywhere): for tiny_cpu's model built from
    scratch, or with `model_dir` for that pretrained model folder (recipe small_instruct_cpu)."""
    out = {"data": {"task": "", "files": [str(HERE / "pairs.jsonl")], "schema": "preference", "eval_size": 8,
                    "demo_error_rate": 0.0},
           "eval": {"num_problems": 0, "k": 0, "max_new_tokens": 12}}
    if model_dir is None:
        return {**out, "model": {"max_seq_len": 48},
                "sft": {"steps": 100, "global_batch_size": 16, "micro_batch_size": 8, "warmup_steps": 5,
                        "save_every": 0},
                "dpo": {"steps": 20, "global_batch_size": 16, "micro_batch_size": 8}}
    return {**out, "model": {"base_path": str(model_dir)},
            "dpo": {"steps": 20, "global_batch_size": 16, "micro_batch_size": 4, "lr": 1e-6}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="a pretrained model folder, or `default` for the one `make real-model` builds (run with "
                         "--recipe small_instruct_cpu); without it: tiny_cpu's model from scratch")
    model = ap.parse_args().model
    if model == "default":
        from posttrain.models.smollm2 import default_dir

        model = default_dir()
    print(json.dumps(overrides(model)))


if __name__ == "__main__":
    main()
