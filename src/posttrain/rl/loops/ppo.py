"""PPO, one step top to bottom over the role groups it reads (`PPORoles`): a learned value baseline (the critic)
instead of GRPO's group statistics, so advantages are per token.

    PromptBatch(v) ─► rollout.generate ─► Trajectories(v) ─┬─► reward.score ─► Rewards (one outcome per sample)
                                                           ├─► reference.log_probs      (kl_coef > 0)
                                                           └─► critic.values ─► Values (B, R_i)
    token rewards: outcome on the last token (- kl_coef * (rollout - reference log-prob) per token when
                   rl.kl_in_reward) ─► GAE(gamma, lam) ─► advantages (whitened over the batch), returns
    CriticBatch(values, returns) ─► critic.update (SPMD; clipped value loss)
        (one pass of one mini-batch and no dropout: critic.fit computes the values, the returns and the
         update from ONE forward per micro-batch - the same numbers, one forward fewer per step)
    TrainBatch(v) with per-token advantages ─► policy.update (SPMD; clipped ratio, dual-clip with
                   rl.clip_ratio_c) ─► v+1          - skipped while step <= rl.critic_warmup_steps

The critic learns before the policy in each step, as in verl (the policy's advantages were computed with the
values of before the critic's update either way). The tensor math is posttrain.rl.algorithms.ppo, equal to
verl 0.9.1's on fixed inputs (tests/unit/test_ppo_math_verl.py).

Leaves out: a critic sharing the policy's body (separate models, as verl's and OpenRLHF's defaults), and value
bootstrapping of truncated samples (a sample cut at max_new_tokens ends with its outcome score, as in verl).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.rl.algorithms import ppo
from posttrain.rl.loops.common import (
    Loop,
    NonFiniteError,
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
from posttrain.rl.roles.critic import CriticBatch, CriticFit
from posttrain.rl.roles.protocols import TrainsCritic
from posttrain.rl.types import PromptBatch, TrainBatch


@dataclass(frozen=True, kw_only=True)
class PPORoles(PolicyGradientRoles):
    critic: TrainsCritic
    """posttrain.rl.roles.critic_group.CriticGroup (values, fit, update, save_state, load_state)."""


class PPO(Loop):
    Roles = PPORoles

    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r = self.cfg, self.roles
        traj = generate(r.rollout, prompts, cfg, run)
        rewards, reward_metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
        ref = reference_logprobs(r.reference, traj, cfg, run)
        mask = response_mask(traj)  # (B, R)
        kl = pad_rows(traj.logprobs, mask.shape) - pad_rows(ref.values, mask.shape) if cfg.kl_in_reward else None  # k1 (B, R)
        rewards_t = ppo.token_rewards(torch.tensor(rewards.scores, dtype=torch.float32), mask, kl=kl,
                                      kl_coef=cfg.kl_coef)  # (B, R)
        if r.critic.one_pass():  # values and the critic's update from one forward (the same numbers)
            with run.phase("critic"):
                values, cstats = r.critic.fit(CriticFit(
                    policy_version=run.version, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                    token_rewards=rows_of(rewards_t, traj.response_ids), gamma=cfg.gamma, lam=cfg.lam,
                    sampled=traj.sampled))
            v = self._checked_values(values, cstats, mask, run)
            with run.phase("advantages"):
                adv, returns = ppo.gae_advantages(rewards_t, v, mask, gamma=cfg.gamma, lam=cfg.lam)
            self._check(adv, returns, mask, run)
        else:
            with run.phase("values"):
                values = r.critic.values(traj)
            v = self._checked_values(values, None, mask, run)
            with run.phase("advantages"):
                adv, returns = ppo.gae_advantages(rewards_t, v, mask, gamma=cfg.gamma, lam=cfg.lam)  # (B, R) each
            self._check(adv, returns, mask, run)
            with run.phase("critic"):
                cstats = r.critic.update(CriticBatch(policy_version=run.version, prompt_ids=traj.prompt_ids,
                                                     response_ids=traj.response_ids, old_values=values.values,
                                                     returns=rows_of(returns, traj.response_ids),
                                                     sampled=traj.sampled))
            self._checked_values(values, cstats, mask, run)

        stats = None
        if run.step > cfg.critic_warmup_steps:
            batch = TrainBatch(policy_version=run.version, prompt_ids=traj.prompt_ids,
                               response_ids=traj.response_ids, old_logprobs=traj.logprobs,
                               ref_logprobs=ref.values if ref is not None and not cfg.kl_in_reward else None,
                               advantages=rows_of(adv, traj.response_ids), sampled=traj.sampled,
                               versions=traj.versions, token_versions=traj.token_versions)
            stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)

        extra = {"critic/value_loss": cstats.value_loss, "critic/clip_fraction": cstats.clip_fraction,
                 "critic/grad_norm": cstats.grad_norm,
                 "critic/vf_explained_var": ppo.explained_variance(v, returns, mask),
                 "critic/values_mean": float(v[mask].mean()), "critic/returns_mean": float(returns[mask].mean()),
                 **advantage_metrics(adv, mask)}
        if kl is not None:
            extra["critic/kl_in_reward"] = float(kl[mask].mean())
        extra.update(reward_metrics)
        return StepOutcome(traj=traj, rewards=rewards, ref=ref, stats=stats, extra=extra,
                           compute_s={"critic": values.compute_s + cstats.compute_s})


    @staticmethod
    def _checked_values(values, cstats, mask: torch.Tensor, run: StepRun) -> torch.Tensor:
        """The values as (B, R); stops the step when they are not finite or the critic's update stopped."""
        check_finite("critic values", [x for row in values.values for x in row], step=run.step)
        if cstats is not None and not cstats.applied:
            raise NonFiniteError(f"step {run.step}: stage critic.update stopped before the optimizer step: "
                                 f"{cstats.stopped}; no checkpoint written")
        return pad_rows(values.values, mask.shape)

    @staticmethod
    def _check(adv: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, run: StepRun) -> None:
        check_finite("advantages", adv[mask].tolist(), step=run.step)
        check_finite("returns", returns[mask].tolist(), step=run.step)
