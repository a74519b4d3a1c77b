"""GRPO, one step top to bottom over the role groups it reads (`GRPORoles`).

    PromptBatch(v) ─► rollout.generate (n per prompt) ─► Trajectories(v) ─┬─► reward.score ─► Rewards
                                                                         └─► reference.log_probs (kl_coef > 0)
    Rewards ─► grpo.group_advantages (per prompt group: centred, optionally std-scaled) ─► one per sample
    TrainBatch(v) = tokens + rollout log-probs + advantages (+ reference) ─► policy.update (SPMD) ─► v+1

The controller then hands the weights to the rollout workers and verifies them (controller.py).
Leaves out: dynamic batch filtering (groups whose rewards are all equal simply get zero advantage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.config import RLConfig
from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.loops.common import (
    PolicyGradientRoles,
    StepOutcome,
    StepRun,
    generate,
    reference_logprobs,
    score,
    update_policy,
)
from posttrain.rl.types import PromptBatch, TrainBatch


@dataclass(frozen=True, kw_only=True)
class GRPORoles(PolicyGradientRoles):
    """GRPO reads only the common roles: no critic, the group's statistics are the baseline."""


class GRPO:
    Roles = GRPORoles

    def __init__(self, cfg: RLConfig, roles: GRPORoles):
        self.cfg, self.roles = cfg, roles

    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r = self.cfg, self.roles
        traj = generate(r.rollout, prompts, cfg, run)
        rewards, reward_metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
        ref = reference_logprobs(r.reference, traj, cfg, run)
        with run.phase("advantages"):
            adv = group_advantages(torch.tensor(rewards.scores), cfg.samples_per_prompt,
                                   std_normalize=cfg.std_normalize).tolist()  # (B,) one per sample
        batch = TrainBatch(policy_version=run.version, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                           old_logprobs=traj.logprobs, ref_logprobs=ref.values if ref else None, advantages=adv)
        stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)
        return StepOutcome(traj=traj, rewards=rewards, ref=ref, stats=stats, extra=reward_metrics)
