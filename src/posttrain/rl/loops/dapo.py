"""DAPO (Yu et al. 2025), one step top to bottom: GRPO's step with dynamic sampling and the soft overlong
punishment. Clip-higher is rl.clip_high (0.28 by default), and the loss is the token mean (rl.loss_agg).

    PromptBatch(v) ─► rollout.generate ─► score (+ overlong penalty) ─► keep the groups whose rewards differ
        └── fewer than rl.prompts_per_step kept: draw the next prompts (run.draw), generate and score again,
            at most rl.max_extra_draws times; then the first prompts_per_step kept groups are the batch
    kept groups ─► reference.log_probs (rl.kl_coef > 0) ─► GRPO's group advantages ─► policy.update ─► v+1

A group whose rewards are all equal has zero advantage, so it would only dilute the batch. If the bound is
reached first, the step trains on the groups it has: it prints a warning and logs dapo/short_batch 1, and it
never trains on a short batch silently. With no group kept at all, the step trains nothing: no update, and the
policy stays at its version. The step's reward metrics (reward_mean, accuracy) cover every sample it drew;
dapo/* says what was kept: kept_groups, dropped_groups, draws, short_batch and overlong_mean (the mean penalty).
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.rl.algorithms.pg import overlong_penalty
from posttrain.rl.loops.common import StepOutcome, StepRun, generate, reference_logprobs, score, update_policy
from posttrain.rl.loops.grpo import GRPO
from posttrain.rl.ragged import per_token_versions, take_rows
from posttrain.rl.types import PromptBatch, Rewards, TrainBatch, Trajectories


class DAPO(GRPO):
    def step(self, prompts: PromptBatch, run: StepRun) -> StepOutcome:
        cfg, r, n = self.cfg, self.roles, self.cfg.samples_per_prompt
        drawn: list[tuple[Trajectories, Rewards]] = []
        kept: list[tuple[Trajectories, list[float]]] = []  # per draw: its kept rows' trajectories and scores
        kept_groups = dropped = draws = 0
        per_draw: list[dict[str, float]] = []
        penalties: list[float] = []
        while True:
            # a seed of its own per draw, apart from the 7919 x rank the rollout workers add
            traj = generate(r.rollout, prompts, cfg, dataclasses.replace(run, seed=run.seed + 1_000_003 * draws))
            rewards, metrics = score(r.reward, traj, cfg, run, scorers=r.scorers)
            per_draw.append(metrics)
            drawn.append((traj, rewards))
            shaped = torch.tensor(rewards.scores, dtype=torch.float32)
            if cfg.overlong_buffer:
                pen = overlong_penalty(torch.tensor([len(x) for x in traj.response_ids]), max_len=cfg.max_new_tokens,
                                       buffer=cfg.overlong_buffer, factor=cfg.overlong_penalty)
                shaped, penalties = shaped + pen, penalties + pen.tolist()
            groups = shaped.view(-1, n)
            differ = (groups.max(dim=1).values > groups.min(dim=1).values).tolist()
            rows = [g * n + j for g, keep in enumerate(differ) if keep for j in range(n)]
            dropped += differ.count(False)
            if rows:
                kept.append((take_rows(traj, rows), shaped[rows].tolist()))
                kept_groups += len(rows) // n
            if kept_groups >= cfg.prompts_per_step or draws >= cfg.max_extra_draws:
                break
            draws += 1
            with run.phase("rollout"):
                prompts = run.draw()
        extra = {"dapo/kept_groups": float(min(kept_groups, cfg.prompts_per_step)), "dapo/dropped_groups": float(dropped),
                 "dapo/draws": float(draws), "dapo/short_batch": float(kept_groups < cfg.prompts_per_step),
                 "dapo/overlong_mean": sum(penalties) / len(penalties) if penalties else 0.0,
                 **{k: sum(m[k] for m in per_draw) / len(per_draw) for k in per_draw[0]}}  # equal-sized draws
        all_traj, all_rewards = concat([t for t, _ in drawn]), concat_rewards([x for _, x in drawn])
        if kept_groups < cfg.prompts_per_step:
            print(f"rl step {run.step}: dapo kept {kept_groups} of {cfg.prompts_per_step} groups after "
                  f"{draws} extra draws (rl.max_extra_draws; {dropped} groups had equal rewards) - "
                  + ("training on a short batch" if kept_groups else "no group to train on: no update this step"),
                  flush=True)
        if not kept_groups:
            return StepOutcome(traj=all_traj, rewards=all_rewards, ref=None, stats=None, extra=extra)
        batch_traj = concat([t for t, _ in kept])
        scores = [s for _, sc in kept for s in sc]
        rows = list(range(min(kept_groups, cfg.prompts_per_step) * n))  # whole groups, the first drawn first
        batch_traj, scores = take_rows(batch_traj, rows), [scores[i] for i in rows]
        ref = reference_logprobs(r.reference, batch_traj, cfg, run)
        with run.phase("advantages"):
            adv = self.advantages(torch.tensor(scores)).tolist()
        batch = TrainBatch(policy_version=run.version, prompt_ids=batch_traj.prompt_ids,
                           response_ids=batch_traj.response_ids, old_logprobs=batch_traj.logprobs,
                           ref_logprobs=ref.values if ref else None, advantages=adv, loss=self.loss,
                           loss_agg=self.loss_agg, sampled=batch_traj.sampled,
                           versions=batch_traj.versions, token_versions=batch_traj.token_versions)
        stats = update_policy(r.policy, batch, cfg, run, rollout=r.rollout)
        return StepOutcome(traj=all_traj, rewards=all_rewards, ref=ref, stats=stats, extra=extra)


def concat(parts: list[Trajectories]) -> Trajectories:
    """The trajectories of several draws at one version, in order: every per-row list joined (take_rows' rule: the
    list fields are the rows), group indices kept distinct across draws, compute time and each sub-phase's summed."""
    if any(t.token_versions is not None for t in parts):  # one draw's episodes spanned a weight update: all per token
        parts = [dataclasses.replace(t, token_versions=per_token_versions(t)) for t in parts]
    rows = [f.name for f in dataclasses.fields(Trajectories) if isinstance(getattr(parts[0], f.name), list)]
    out: dict[str, list] = {f: [] for f in rows}
    offset = 0
    for t in parts:
        for f in rows:
            out[f] += [g + offset for g in t.group_index] if f == "group_index" else list(getattr(t, f))
        offset += max(t.group_index, default=-1) + 1
    sub_phase_s: dict[str, float] = {}
    for t in parts:
        for role, seconds in t.sub_phase_s.items():
            sub_phase_s[role] = sub_phase_s.get(role, 0.0) + seconds
    return dataclasses.replace(parts[0], compute_s=sum(t.compute_s for t in parts), sub_phase_s=sub_phase_s, **out)


def concat_rewards(parts: list[Rewards]) -> Rewards:
    return Rewards(policy_version=parts[0].policy_version, scores=[s for p in parts for s in p.scores],
                   failures=[f for p in parts for f in p.failures], scorer=parts[0].scorer,
                   compute_s=sum(p.compute_s for p in parts))
