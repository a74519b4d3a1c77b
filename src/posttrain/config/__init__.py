"""Typed configuration for the whole post-training pipeline.

One `PipelineConfig` describes a run end to end (data -> SFT -> RL -> eval), but every Flyte task receives
only its own part (plus the run id), so that changing, say, an RL setting does not change the inputs -
and therefore the cache keys - of the data-prep or SFT stages.

All classes are frozen, keyword-only dataclasses: flytekit passes them between tasks as typed values, and
nothing can mutate a config after `validate()` has accepted it. Recipes (`posttrain.recipes`) are functions
that return a `PipelineConfig`.

    algorithms.py every rl.algorithm (the Algorithm enum) and its declaration: the settings only it reads, its
                  published defaults, its roles (the rest of the config reads these)
    enums.py      the other closed sets of choices (DataFormat, PlacementMode, ...)
    sections.py   one dataclass per part (DataConfig, SFTConfig, RLConfig, ...), each field documented
    dense.py      the dense objectives' parts beside SFT (PairsConfig, DPOConfig, RewardModelConfig, DistillConfig)
    pipeline.py   PipelineConfig, which holds them all, and objective_of
    serialize.py  to_dict / from_dict, and apply_overrides (JSON edits of a recipe)
    algorithm_defaults.py  applies an algorithm's published defaults to the rl settings a user leaves unset
    checks.py     validate: every bad value or combination, with the field named, before work starts

Everything is importable from `posttrain.config` directly.
"""

from posttrain.config.algorithms import Algorithm
from posttrain.config.checks import validate
from posttrain.config.dense import DistillConfig, DPOConfig, PairsConfig, RewardModelConfig
from posttrain.config.enums import (
    Arch,
    Backend,
    DataFormat,
    DataSchema,
    DistillLoss,
    DPOLoss,
    DType,
    KLEstimator,
    LossAgg,
    MismatchCorrection,
    Objective,
    Parallelism,
    PlacementMode,
    RolloutBackend,
)
from posttrain.config.errors import ConfigError
from posttrain.config.pipeline import PipelineConfig, objective_of
from posttrain.config.sections import (
    DataConfig,
    EpisodeConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    PassRateConfig,
    PlacementConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    TokenizerConfig,
    TrackingConfig,
)
from posttrain.config.serialize import apply_overrides, from_dict, to_dict

__all__ = [
    "Algorithm",
    "Arch",
    "Backend",
    "ConfigError",
    "DPOConfig",
    "DPOLoss",
    "DType",
    "DataConfig",
    "DataFormat",
    "DataSchema",
    "DistillConfig",
    "DistillLoss",
    "EpisodeConfig",
    "EvalConfig",
    "KLEstimator",
    "LoraConfig",
    "LossAgg",
    "MismatchCorrection",
    "ModelConfig",
    "Objective",
    "PairsConfig",
    "Parallelism",
    "PassRateConfig",
    "PipelineConfig",
    "PlacementConfig",
    "PlacementMode",
    "RLConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutBackend",
    "SFTConfig",
    "TokenizerConfig",
    "TrackingConfig",
    "apply_overrides",
    "from_dict",
    "objective_of",
    "to_dict",
    "validate",
]
