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

from posttrain.config import LossAgg
from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.loops.common import (
    Loop,
    PolicyGradientRoles,
    StepOutcome,
    StepRun,
    generate,
    reference_logprobs,
    score,
    update_policy,
)
from posttrain.rl.types import PolicyLoss, PromptBatch, TrainBatch


@dataclass(frozen=True, kw_only=True)
class GRPORoles(PolicyGradientRoles):
    """GRPO reads only the common roles: no critic, the group's statistics are the baseline."""


class GRPO(Loop):
    """GRPO's step. Its family (loops/family.py: RLOO, Dr. GRPO, GSPO) runs the same step with another
    `advantages` baseline or another policy objective (`loss`, `loss_agg`)."""

    Roles = GRPORoles
    loss: PolicyLoss = PolicyLoss.CLIP
    loss_agg: LossAgg | None = None
    """None: rl.loss_agg."""

    def advantages(self, scores: torch.Tensor) -> torch.Tensor:
        """(B,) rewards, grouped by prompt -> (B,) one advantage per sample: centred per group, std-scaled
        with rl.std_normalize."""
        return group_advantages(scores, self.cfg.samples_per_prompt, std_normalize=self.cfg.std_normalize)

    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r = self.cfg, self.roles
        traj = generate(r.rollout, prompts, cfg, run)
        rewards, reward_metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
        ref = reference_logprobs(r.reference, traj, cfg, run)
        with run.phase("advantages"):
            adv = self.advantages(torch.tensor(rewards.scores)).tolist()  # (B,) one per sample
        batch = TrainBatch(policy_version=run.version, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                           old_logprobs=traj.logprobs, ref_logprobs=ref.values if ref else None, advantages=adv,
                           loss=self.loss, loss_agg=self.loss_agg, sampled=traj.sampled,
                           versions=traj.versions, token_versions=traj.token_versions)
        stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)
        return StepOutcome(traj=traj, rewards=rewards, ref=ref, stats=stats, extra=reward_metrics)
