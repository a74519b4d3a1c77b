"""RLHF on your own preference data: a reward model trained on your pairs, then PPO against it (`rlhf_pipeline`).

    .venv/bin/pyflyte run workflows/pipeline.py rlhf_pipeline --recipe tiny_cpu_rlhf \\
        --overrides "$(.venv/bin/python examples/rlhf/overrides.py)"
    .venv/bin/python examples/rlhf/overrides.py --pairs /path/to/your/pairs.jsonl    # your own rows

The pairs are examples/preference_dpo's pairs.jsonl, with the same data and SFT settings: after that example's run
the data prep and SFT stages here are cache hits. What each setting does (docs/ppo.md has PPO and the critic,
docs/dense.md the reward model and every form preference rows may take, docs/settings.md every setting):
- `data`: no built-in task; each row a `prompt`, the `chosen` and the `rejected` answer (schema `preference`) and
  an optional reference `answer`; 8 rows held out (`eval_size`). The data are the pairs (no `pairs` stage samples
  any): the reward model trains on the train rows' pairs and reports its pairwise accuracy on the held-out ones,
  and RL's prompts are the train rows' prompts.
- `sft`: trains on prompt + chosen; the reward model (its body with a scalar head), the policy and the critic all
  start from that model.
- `reward_model`: 30 steps of 16 pairs, 3 of them warm-up.
- `rl`: PPO (the recipe's algorithm), 20 steps of 16 prompts x 4 samples of at most 12 tokens; the critic trains
  alone for the first 5. tiny_cpu_rlhf makes the reward model the only reward (`reward.fn_weight` 0) with a KL
  penalty to the SFT model in it; the verifier (exact match against `answer`) scores the samples for the logs only.
- `eval`: greedy accuracy on the held-out rows by that verifier, 12 new tokens; rows without an `answer` score 0.
- `model.max_seq_len` 48 (tiny_cpu: 32): a question, its answer and the chat template fit; `demo_error_rate` 0:
  tiny_cpu's sloppy addition teacher does not apply to files.
tests/integration/test_dense_pipelines_e2e.py runs this example at tiny size (two PPO steps) in `make test`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PAIRS = Path(__file__).resolve().parent.parent / "preference_dpo" / "pairs.jsonl"


def overrides(pairs: str | Path = PAIRS) -> dict:
    """The example's settings for the preference rows in `pairs` (absolute paths, so the command runs from
    anywhere). Data, model and SFT settings are examples/preference_dpo's, so the two share those stages."""
    return {"data": {"task": "", "files": [str(Path(pairs).resolve())], "schema": "preference", "eval_size": 8,
                     "demo_error_rate": 0.0},
            "model": {"max_seq_len": 48},
            "sft": {"steps": 100, "global_batch_size": 16, "micro_batch_size": 8, "warmup_steps": 5, "save_every": 0},
            "reward_model": {"steps": 30, "global_batch_size": 16, "micro_batch_size": 8, "warmup_steps": 3},
            "rl": {"steps": 20, "prompts_per_step": 16, "samples_per_prompt": 4, "max_new_tokens": 12,
                   "checkpoint_every": 0},
            "eval": {"num_problems": 0, "k": 0, "max_new_tokens": 12}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(PAIRS), help=f"a jsonl file of preference rows (default: {PAIRS})")
    print(json.dumps(overrides(ap.parse_args().pairs)))


if __name__ == "__main__":
    main()
