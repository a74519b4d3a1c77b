"""On-policy distillation, one step top to bottom: the student samples, the teacher scores every sampled token,
and the per-token reverse KL is the advantage (Agarwal et al. 2024; Thinking Machines' "on-policy distillation").

    PromptBatch(v) ─► rollout.generate ─► Trajectories(v) ─┬─► reward.score (logged; mixed in below)
                                                          ├─► reference.log_probs (rl.kl_coef > 0)
                                                          └─► teacher.log_probs (same sampling distribution)
    advantage_t = log p_teacher(y_t) - log p_student(y_t)            (minus the per-token reverse-KL sample)
                  + rl.distill_reward_weight x the task reward's group advantage (GRPO's; 0 by default)
    TrainBatch(v) with per-token advantages ─► policy.update (clipped ratio) ─► v+1

The student's log-probs are the rollout's own, at the version that sampled, so the advantage is that of the
samples drawn. Tokens where the student is more sure than the teacher get a negative advantage, and tokens
where it is less sure get a positive one: the policy moves toward the teacher on its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.loops.common import (
    Loop,
    PolicyGradientRoles,
    StepOutcome,
    StepRun,
    check_finite,
    generate,
    reference_logprobs,
    response_mask,
    score,
    update_policy,
)
from posttrain.rl.ragged import pad_rows, rows_of
from posttrain.rl.roles.protocols import GivesLogProbs
from posttrain.rl.types import PromptBatch, TrainBatch


@dataclass(frozen=True, kw_only=True)
class DistillRoles(PolicyGradientRoles):
    teacher: GivesLogProbs
    """posttrain.rl.roles.teacher.TeacherGroup (log_probs)."""


class OnPolicyDistill(Loop):
    Roles = DistillRoles

    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r = self.cfg, self.roles
        traj = generate(r.rollout, prompts, cfg, run)
        rewards, reward_metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
        ref = reference_logprobs(r.reference, traj, cfg, run)
        with run.phase("teacher"):
            teacher = r.teacher.log_probs(traj, temperature=cfg.temperature)
        check_finite("teacher log-probs", [x for row in teacher.values for x in row], step=run.step)
        with run.phase("advantages"):
            mask = response_mask(traj)  # (B, R)
            reverse_kl = (pad_rows(traj.logprobs, mask.shape) - pad_rows(teacher.values, mask.shape)) * mask  # (B, R)
            adv = -reverse_kl
            if cfg.distill_reward_weight:
                task = group_advantages(torch.tensor(rewards.scores), cfg.samples_per_prompt,
                                        std_normalize=cfg.std_normalize)
                adv = adv + cfg.distill_reward_weight * task[:, None] * mask
        batch = TrainBatch(policy_version=run.version, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                           old_logprobs=traj.logprobs, ref_logprobs=ref.values if ref else None,
                           advantages=rows_of(adv, traj.response_ids), sampled=traj.sampled,
                           versions=traj.versions, token_versions=traj.token_versions)
        stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)
        k = reverse_kl[mask]
        extra = {"distill/reverse_kl": float(k.mean()), "distill/reverse_kl_max": float(k.max()),
                 "distill/teacher_logp": float(pad_rows(teacher.values, mask.shape)[mask].mean()), **reward_metrics}
        return StepOutcome(traj=traj, rewards=rewards, ref=ref, stats=stats, extra=extra,
                           compute_s={"teacher": teacher.compute_s})
