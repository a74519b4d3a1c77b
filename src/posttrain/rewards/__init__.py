"""Scoring completions: the built-in verifiers or the user's reward function (scorer.py), the function run in its
own killable, limited process (sandbox.py)."""

from posttrain.rewards.sandbox import RewardFunctionError
from posttrain.rewards.scorer import (
    MAX_TIMEOUTS_PER_SCORE,
    RESERVED,
    RewardResult,
    RewardSample,
    RewardScorer,
    reward_identity,
)

__all__ = ["MAX_TIMEOUTS_PER_SCORE", "RESERVED", "RewardFunctionError", "RewardResult", "RewardSample",
           "RewardScorer", "reward_identity"]
