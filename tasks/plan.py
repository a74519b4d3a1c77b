"""The `plan` task: turn a recipe name + JSON overrides into the validated config parts of one run.

Every invalid value is rejected here, before any stage starts, and each later task receives only its own
part (plus the run id), so an RL change never invalidates the data-prep or SFT caches.

A rejected config prints `plan: error: <field>: <what is allowed>` first (stdout, flushed), then raises a
fresh ConfigError without the validator's frames: `pyflyte run` prints every task error as a boxed traceback
before its message (about 60 lines for a deep validation error; it has no switch to leave it out), so the
one line comes first and the traceback that follows is the workflow and plan frames only.
"""

from __future__ import annotations

from typing import NamedTuple

from flytekit import current_context, task

from images.specs import cpu_image
from posttrain.config import (
    ConfigError,
    DataConfig,
    DataSchema,
    DistillConfig,
    DPOConfig,
    EvalConfig,
    ModelConfig,
    PairsConfig,
    PlacementConfig,
    RewardConfig,
    RewardModelConfig,
    RLConfig,
    SFTConfig,
    TrackingConfig,
)
from tasks import settings


class Plan(NamedTuple):
    run_id: str
    data: DataConfig
    model: ModelConfig
    sft: SFTConfig
    eval: EvalConfig
    rl: RLConfig
    reward: RewardConfig
    placement: PlacementConfig
    tracking: TrackingConfig
    sft_enabled: bool
    pairs: PairsConfig
    dpo: DPOConfig
    reward_model: RewardModelConfig
    distill: DistillConfig
    pairs_from_samples: bool
    pass_rate_enabled: bool
"""`sft_enabled` repeats `sft.enabled` as a plain bool: Flyte's `conditional` compares only primitive outputs.
`pairs_from_samples`: the data are prompts, so dpo_pipeline and reward_model_pipeline make preference pairs from
the SFT model's samples; false for preference data (data.schema 'preference'), which are the pairs.
`pass_rate_enabled` repeats `data.pass_rate.enabled`: `pipeline` selects RL's prompts by pass rate."""


@task(container_image=cpu_image)
def plan(recipe: str, overrides: str, run_id: str, workflow: str = "") -> Plan:
    """`workflow`: the calling workflow's name (every workflow passes its own); the sections it uses beyond
    data/model/sft/eval/rl (dpo, pairs, pass_rate, ...) are validated, and settings of the others that would do
    nothing refused where the checks say so (posttrain.recipes.WORKFLOW_SECTIONS; "": none)."""
    from posttrain.artifacts.run_ids import new_run_id
    from posttrain.recipes import resolve_with_notes

    try:
        cfg, notes = resolve_with_notes(recipe, overrides, workflow=workflow)
        local = current_context().execution_id.name == "local"  # every local execution is named so
        settings.check_against(cfg.sft.nproc, cfg.placement.policy_workers, cfg.placement.rollout_workers,
                               local=local)
    except ConfigError as e:  # includes RewardFunctionError; see the module docstring
        print(f"plan: error: {e}", flush=True)
        raise ConfigError(str(e)) from None
    rid = run_id or new_run_id()
    print(f"plan: run {rid}, recipe {cfg.name}")
    for note in notes:  # e.g. the algorithm's published defaults it took (posttrain.config.algorithm_defaults)
        print(f"plan: {note}")
    return Plan(rid, cfg.data, cfg.model, cfg.sft, cfg.eval, cfg.rl, cfg.reward, cfg.placement, cfg.tracking,
                cfg.sft.enabled, cfg.pairs, cfg.dpo, cfg.reward_model, cfg.distill,
                cfg.data.schema != DataSchema.PREFERENCE, cfg.data.pass_rate.enabled)
