"""The RL stage: `rl.algorithm` from a start model on a dataset's train prompts, on the Ray cluster the Flyte Ray
task started, resumable from its state folder and cached on its inputs (every model a role reads included)."""

from __future__ import annotations

from dataclasses import replace

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.artifacts.state import StateDir
from posttrain.config import ModelConfig, PlacementConfig, RewardConfig, RLConfig, TrackingConfig, to_dict
from posttrain.models.folders import model_folder
from posttrain.stages.support import check_budget, drop_state, source_digest, without_keep_state
from posttrain.tracking.wandb_run import WandbRun


def rl(rl_cfg: RLConfig, reward: RewardConfig, placement: PlacementConfig, tracking: TrackingConfig, *,
       max_seq_len: int, start_model: ArtifactRef, dataset: ArtifactRef, run_id: str,
       model_cfg: ModelConfig | None = None, store: ArtifactStore | None = None,
       reward_model: ArtifactRef | None = None) -> ArtifactRef:
    """RL (`rl.algorithm`) from `start_model` on the dataset's train prompts; returns the final RL `model`
    artifact, whose parents are the start model, the dataset and every model a role reads (`reward.models`,
    `rl.critic_init`: rl.model_inputs).
    `reward_model`: a reward model a workflow trained (rlhf_pipeline), scoring first with weight 1.0 before
    those of `reward.models`.

    Must run where Ray is initialised (the Flyte Ray task's pre_execute does it). Training state lives in a
    folder keyed by the inputs, so a killed task resumes from its last checkpoint when it is re-run; it is
    deleted once the final model is stored, unless `rl.keep_state`. `model_cfg` gives the workers their
    dtype and gradient checkpointing (None: fp32, no checkpointing).
    """
    from posttrain.rl import model_inputs
    from posttrain.rl.run import run_rl

    store = store or ArtifactStore()
    if not rl_cfg.enabled:
        print("rl: disabled (rl.enabled=false): passing the start model through")
        return start_model
    if reward_model is not None:
        reward = replace(reward, models=[reward_model.id, *reward.models],
                         model_weights=[1.0, *(reward.model_weights or [1.0] * len(reward.models))])
    # every model a role reads (reward.models, rl.critic_init) as a stored artifact: the key and the lineage
    # name them by id - a content hash -, the actors read their folders
    models = model_inputs.resolve(rl_cfg, reward, run_id=run_id, store=store)
    key = _cache_key(store, models, rl_cfg, reward, placement, max_seq_len, model_cfg, start_model, dataset)
    hit = store.cache_get(key)
    if hit is not None:
        print(f"rl: cache hit -> model {hit.short}")
        return hit
    start_dir, ds_dir = model_folder(store, start_model), store.get(dataset)
    # Before any generation: the train prompts plus rl.max_new_tokens must fit the model's context budget.
    check_budget(ds_dir, start_dir, max_seq_len=max_seq_len, max_new_tokens=rl_cfg.max_new_tokens, sft=False,
                  setting="rl.max_new_tokens")
    state = StateDir.under_store(store.root, "rl", key)
    print(f"rl: state in {state}", flush=True)
    wandb_run = WandbRun.for_stage(tracking, stage="rl", run_id=run_id, store=store,
                                   inputs={"start_model": start_model.id, "dataset": dataset.id,
                                           **{name: r.id for name, r in models.refs.items()}},
                                   settings={"rl": rl_cfg, "reward": reward, "placement": placement,
                                             "max_seq_len": max_seq_len, "model": model_cfg})
    result = run_rl(rl_cfg=models.rl, reward_cfg=models.reward,
                    model_cfg=model_cfg, placement_cfg=placement, max_seq_len=max_seq_len,
                    tracking_cfg=tracking, start_model_dir=start_dir, dataset_dir=ds_dir, store_root=str(store.root),
                    run_id=run_id, parents=[start_model.id, dataset.id, *[r.id for r in models.refs.values()]],
                    state_dir=state.location,
                    start_model_id=start_model.id, wandb_run=wandb_run)
    store.cache_put(key, result.model)
    if not rl_cfg.keep_state:  # only after the final model is stored: a failed run keeps its state and resumes
        drop_state(state)
    print(f"rl: model {result.model.short} after {result.steps} updates")
    return result.model


def _cache_key(store: ArtifactStore, models, rl_cfg: RLConfig, reward: RewardConfig, placement: PlacementConfig,
               max_seq_len: int, model_cfg: ModelConfig | None, start_model: ArtifactRef, dataset: ArtifactRef) -> str:
    """What the RL model depends on: the settings (models by id), the inputs, our code, and the user's code by
    source - the reward function's and what each role's checks before any actor return (registry `preflight`:
    with multi-turn episodes the environment's and tools', which import in a short-lived child, and the start
    model's chat template must keep an episode's tokens)."""
    from posttrain.rewards import reward_identity
    from posttrain.rl.roles import registry

    settings = registry.RunSettings(rl=rl_cfg, reward=reward, placement=placement, model=model_cfg,
                                    start_model_dir="")  # filled in by preflight only when a role checks it
    checked, code = registry.preflight(settings, lambda: str(model_folder(store, start_model)))
    return store.cache_key("rl", without_keep_state(models.rl_ids), to_dict(models.reward_ids), to_dict(placement),
                           max_seq_len,
                           (model_cfg.dtype.value, model_cfg.gradient_checkpointing) if model_cfg else None,
                           *([to_dict(model_cfg.lora)] if model_cfg and model_cfg.lora else []),
                           *checked,
                           *([reward_identity(reward)] if reward.fn else []),
                           start_model.id, dataset.id,
                           source_digest("rl", "spmd", "models", "rewards", "data/verifiers.py", *code))
