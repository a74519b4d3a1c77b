"""REINFORCE++, one step top to bottom over the common roles (no critic, no group baseline).

    PromptBatch(v) ─► rollout.generate ─► Trajectories(v) ─┬─► reward.score (+ scoring roles) ─► Rewards
                                                          └─► reference.log_probs (rl.kl_coef > 0)
    token rewards: the outcome on each response's last token, minus rl.kl_coef x KL(rollout || reference) on
    every token (rl.kl_estimator) ─► discounted returns (rl.gamma) ─► whitened over the batch's tokens
    TrainBatch(v) with per-token advantages, no KL term in the loss (it is in the reward) ─► policy.update ─► v+1

The math is posttrain.rl.algorithms.pg.reinforce_pp_returns (equal to verl 0.9.1's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.rl.algorithms.grpo import kl_penalty
from posttrain.rl.algorithms.pg import reinforce_pp_returns
from posttrain.rl.algorithms.ppo import token_rewards
from posttrain.rl.loops.common import (
    Loop,
    PolicyGradientRoles,
    StepOutcome,
    StepRun,
    advantage_metrics,
    check_finite,
    generate,
    reference_logprobs,
    response_mask,
    score,
    update_policy,
)
from posttrain.rl.ragged import pad_rows, rows_of
from posttrain.rl.types import PromptBatch, TrainBatch


@dataclass(frozen=True, kw_only=True)
class ReinforcePPRoles(PolicyGradientRoles):
    """REINFORCE++ reads only the common roles: the batch is the baseline."""


class ReinforcePP(Loop):
    Roles = ReinforcePPRoles

    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r = self.cfg, self.roles
        traj = generate(r.rollout, prompts, cfg, run)
        rewards, reward_metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
        ref = reference_logprobs(r.reference, traj, cfg, run)
        with run.phase("advantages"):
            mask = response_mask(traj)  # (B, R)
            kl = (kl_penalty(pad_rows(traj.logprobs, mask.shape), pad_rows(ref.values, mask.shape), cfg.kl_estimator)
                  if ref is not None else None)
            rewards_t = token_rewards(torch.tensor(rewards.scores, dtype=torch.float32), mask, kl=kl,
                                      kl_coef=cfg.kl_coef)
            adv = reinforce_pp_returns(rewards_t, mask, gamma=cfg.gamma)  # (B, R)
        check_finite("advantages", adv[mask].tolist(), step=run.step)
        batch = TrainBatch(policy_version=run.version, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                           old_logprobs=traj.logprobs, ref_logprobs=None, advantages=rows_of(adv, traj.response_ids),
                           sampled=traj.sampled, versions=traj.versions, token_versions=traj.token_versions)
        stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)
        extra = {**advantage_metrics(adv, mask), **reward_metrics}
        if kl is not None:
            extra["reward/kl_in_reward"] = float(kl[mask].mean())
        return StepOutcome(traj=traj, rewards=rewards, ref=ref, stats=stats, extra=extra)
