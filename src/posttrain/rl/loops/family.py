"""GRPO's family: GRPO's step (loops/grpo.py) read top to bottom, with another baseline or another policy
objective. Each class says only what differs; the math is posttrain.rl.algorithms (equal to verl 0.9.1's).

    RLOO     advantages: the leave-one-out baseline, r_i - mean of the group's other samples (no std scaling)
    DrGRPO   advantages: centred per group, never std-scaled; loss: token sums / (sequences x max_new_tokens)
    GSPO     loss: the clipped sequence-level ratio (pg.gspo_loss), the sequence mean of token means;
             advantages: GRPO's (rl.std_normalize)
"""

from __future__ import annotations

import torch

from posttrain.config import LossAgg
from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.algorithms.pg import rloo_advantages
from posttrain.rl.loops.grpo import GRPO
from posttrain.rl.types import PolicyLoss


class RLOO(GRPO):
    def advantages(self, scores: torch.Tensor) -> torch.Tensor:
        return rloo_advantages(scores, self.cfg.samples_per_prompt)


class DrGRPO(GRPO):
    loss_agg = LossAgg.SEQ_MEAN_TOKEN_SUM_NORM

    def advantages(self, scores: torch.Tensor) -> torch.Tensor:
        return group_advantages(scores, self.cfg.samples_per_prompt, std_normalize=False)


class GSPO(GRPO):
    loss = PolicyLoss.GSPO
    loss_agg = LossAgg.SEQ_MEAN
