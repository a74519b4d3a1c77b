"""The prompt selection before RL (`data.pass_rate`; posttrain.eval.pass_rate): the start model's pass rate on
each train prompt, and a `dataset` artifact of the prompts kept, cached on the model, the data and the settings
that decide the rates like every stage in `posttrain.stages`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import DataConfig, RewardConfig, RLConfig, to_dict
from posttrain.models.folders import model_folder
from posttrain.stages.support import source_digest


def select_prompts(data: DataConfig, rl: RLConfig, reward: RewardConfig, *, model: ArtifactRef,
                   dataset: ArtifactRef, run_id: str, store: ArtifactStore | None = None) -> ArtifactRef:
    """With data.pass_rate.enabled: the train prompts of `dataset` that `model` (RL's start model) solves in some
    but not all of its samples, as a `dataset` artifact whose parents are the model and the dataset (so the RL
    model's lineage reaches both); otherwise `dataset` itself."""
    from posttrain.eval.pass_rate import select_by_pass_rate

    cfg = data.pass_rate
    if not cfg.enabled:
        return dataset
    store = store or ArtifactStore()
    reward = reward.function_only()  # rates are the function's or verifier's, as RL's accuracy
    sampling = {"temperature": rl.temperature, "top_p": rl.top_p, "top_k": rl.top_k,
                "max_new_tokens": rl.max_new_tokens}
    key = store.cache_key("pass_rate", to_dict(cfg), sampling, to_dict(reward), model.id, dataset.id,
                          source_digest("eval", "models", "rewards", "data/verifiers.py", "data/examples.py",
                                        "data/chat.py", "rl/roles/rollout_vllm.py"))
    hit = store.cache_get(key)
    if hit is not None:
        print(f"pass_rate: cache hit -> dataset {hit.short}")
        return hit
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="posttrain-pass-rate-") as tmp:
        info = select_by_pass_rate(model_folder(store, model), store.get(dataset), cfg, rl, reward,
                                   Path(tmp) / "selected")
        ref = store.put("dataset", f"{dataset.name}-pass-rate", Path(tmp) / "selected", run_id=run_id,
                        parents=[model.id, dataset.id],
                        config={"pass_rate": to_dict(cfg), "sampling": sampling, "reward": to_dict(reward)},
                        metrics={"num_train": info.kept, "sampled": info.sampled, "never_solved": info.never_solved,
                                 "always_solved": info.always_solved, "mean_rate": info.mean_rate,
                                 "reward_failures": info.reward_failures,
                                 "seconds": time.perf_counter() - t0},  # what selection cost, beside RL's steps
                        extra={"stage": "pass_rate", "source_model": model.id, "source_dataset": dataset.id})
    store.cache_put(key, ref)
    print(f"pass_rate: dataset {ref.short} ({info.kept} of {info.sampled} train prompts kept, from model "
          f"{model.short})")
    return ref
