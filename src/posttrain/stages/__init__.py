"""Pipeline stages with artifact bookkeeping: resolve input handles, skip work on a cache hit, run the library
function, store the output with its manifest, return a handle - one module per stage:

    data.py        data_prep                   dataset (+ tokenizer) artifact
    sft.py         sft, train, frozen_model    SFT and every dense objective (DPO, reward model, distillation)
    rl.py          rl                          `rl.algorithm` on the Ray cluster the Flyte Ray task gives
    eval.py        evaluate                    held-out accuracy with the task's verifier or the user's reward
    preference.py  pairs, evaluate_reward_model
    pass_rate.py   select_prompts              RL's train prompts kept by the start model's pass rate
    support.py     what they share: the source digest of a cache key, the token budget check, dropping state

The Flyte tasks in `tasks/` are one-line wrappers around these functions, so every stage can also be run and
tested without Flyte. A stage's cache key is made of its config part, the content ids (or source bytes) of its
inputs, and a digest of the library source that implements it - so an edited source file or a changed setting
is noticed, while an RL setting never invalidates data prep or SFT.
"""

from posttrain.models.refs import start_model
from posttrain.stages.data import DataOutputs, data_prep
from posttrain.stages.eval import EvalOutputs, evaluate
from posttrain.stages.pass_rate import select_prompts
from posttrain.stages.preference import evaluate_reward_model, pairs
from posttrain.stages.rl import rl
from posttrain.stages.sft import frozen_model, sft, sft_cache_key, train

__all__ = ["DataOutputs", "EvalOutputs", "data_prep", "evaluate", "evaluate_reward_model", "frozen_model", "pairs",
           "rl", "select_prompts", "sft", "sft_cache_key", "start_model", "train"]
