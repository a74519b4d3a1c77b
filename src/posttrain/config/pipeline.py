"""`PipelineConfig`, the whole run's config (one section per pipeline part), and `objective_of`."""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.config.dense import DistillConfig, DPOConfig, PairsConfig, RewardModelConfig
from posttrain.config.enums import Objective
from posttrain.config.sections import (
    DataConfig,
    EvalConfig,
    ModelConfig,
    PlacementConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    TrackingConfig,
)


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    name: str = "tiny_cpu"
    """Recipe name, recorded in manifests."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The scoring function shared by RL and evaluation."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    """Preference pairs from the SFT model's own samples (dpo_pipeline, reward_model_pipeline on prompt data)."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """The DPO stage of dpo_pipeline."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """The reward-model stage of reward_model_pipeline."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """The distillation stage of distill_pipeline."""


def objective_of(cfg: SFTConfig) -> Objective:
    """The dense trainer's objective for a trainer config section: its class decides (a `match`, no registry)."""
    match cfg:
        case DPOConfig():
            return Objective.DPO
        case RewardModelConfig():
            return Objective.REWARD_MODEL
        case DistillConfig():
            return Objective.DISTILL
        case SFTConfig():
            return Objective.SFT
    raise TypeError(f"not a trainer config: {type(cfg).__name__}")
