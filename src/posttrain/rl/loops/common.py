"""The phases every RL algorithm shares, each with its checks, so a loop reads as its dataflow and cannot skip
a gate: generate -> score -> reference log-probs -> (the algorithm's own advantages) -> update the policy.

    traj = generate(roles.rollout, prompts, cfg, run)              # version + finite log-probs checked
    rewards, metrics = score(roles.reward, traj, cfg, run, scorers=roles.scorers)  # failures + finite checked
    ref = reference_logprobs(roles.reference, traj, cfg, run)      # None without a reference role
    stats = update_policy(roles.policy, batch, cfg, run, rollout=roles.rollout)  # drift + applied + version

`StepRun` is what the controller hands a loop for one step: the step's number, the policy version it starts
from, its rollout seed and `phase(name)`, which times a phase and tells the driver's watchdog where the step is.
A loop returns a `StepOutcome`; the controller pushes the new weights, builds the metrics and checkpoints.

A step stops with `RewardFailureError` (naming the function, the failure count, the step and one reason) when
more than `rl.max_reward_failure_rate` of its reward calls failed - before the update, so no weights are trained
on a broken reward - and with `NonFiniteError` (naming the step, the stage and the tensor) on a non-finite
number before the update, or when the update stopped before its optimizer step (drift above
`rl.drift_threshold`, a non-finite loss or gradient norm: `WeightDriftError` for drift); no checkpoint holds
the poisoned step either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

from posttrain.config import RLConfig
from posttrain.rl.ragged import all_versions, loss_mask
from posttrain.rl.roles.protocols import Generates, GivesLogProbs, Scorer, ScoresWithFunctions, TrainsPolicy
from posttrain.rl.types import LogProbs, PromptBatch, Rewards, TrainBatch, Trajectories, UpdateStats
from posttrain.rl.weight_sync import drift_gate


class RewardFailureError(RuntimeError):
    """Too many reward calls of one step failed: the rewards would be mostly zeros, so training stops."""


class NonFiniteError(RuntimeError):
    """A NaN or infinity in a step's numbers: the step stopped before the optimizer step and any checkpoint."""


@dataclass(frozen=True, kw_only=True)
class PolicyGradientRoles:
    """The role groups every policy-gradient loop reads, typed by what they do (rl/roles/protocols.py); an
    algorithm's own `Roles` adds to these (PPO: critic). The groups are the classes in rl/roles/ (or in-process
    fakes with the same methods)."""

    rollout: Generates
    """roles.rollout.RolloutGroup (or PolicyRollout)."""
    reward: ScoresWithFunctions
    """roles.reward.RewardGroup."""
    policy: TrainsPolicy
    """roles.policy_group.PolicyGroup."""
    reference: GivesLogProbs | None = None
    """roles.reference.ReferenceGroup (or PolicyBaseReference): present exactly when rl.kl_coef > 0."""
    scorers: tuple[Scorer, ...] = ()
    """The run's scoring groups (registry rows with `scores=True`, e.g. the learned reward models: `role`,
    `score(Trajectories) -> Scores`, `weighted(Scores)`), in ROLES order: `score` adds each one's weighted scores
    to the functions'."""


class Loop:
    """What every algorithm's loop holds: its settings and the role groups its `Roles` dataclass names. A loop
    adds `Roles` and `step(prompts, run) -> StepOutcome`."""

    Roles: type = PolicyGradientRoles

    def __init__(self, cfg: RLConfig, roles: PolicyGradientRoles):
        self.cfg, self.roles = cfg, roles


@dataclass(frozen=True, kw_only=True)
class StepRun:
    step: int
    """1-based number of the step being run."""
    version: int
    """Policy version the step starts from (the rollout workers hold it, verified)."""
    seed: int
    """Rollout sampling seed, drawn from the controller's RNG (restored on resume)."""
    phase: Callable[[str], AbstractContextManager]
    """`with run.phase("rollout"): ...` times the body as that phase and marks it as the step's stage."""
    draw: Callable[[], PromptBatch] | None = None
    """More prompts for this step (DAPO's dynamic sampling): the sampler's next batch at this version; its
    cursor moves on, so a resumed run draws the same prompts."""


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    traj: Trajectories
    rewards: Rewards
    ref: LogProbs | None
    stats: UpdateStats | None
    """The policy update's stats; None when the step trained no policy (PPO's critic warm-up): no weight sync."""
    extra: dict[str, float] = field(default_factory=dict)
    """The algorithm's own metrics ("critic/value_loss", "adv/mean", ...), logged beside the common ones."""
    compute_s: dict[str, float] = field(default_factory=dict)
    """Worker-timed seconds of roles beyond rollout, reward, reference and the policy update (e.g. critic)."""


def generate(rollout: Generates, prompts: PromptBatch, cfg: RLConfig, run: StepRun) -> Trajectories:
    with run.phase("rollout"):
        traj = rollout.generate(prompts, n=cfg.samples_per_prompt, temperature=cfg.temperature,
                                max_new_tokens=cfg.max_new_tokens, seed=run.seed, top_p=cfg.top_p, top_k=cfg.top_k)
    if cfg.max_staleness == 0:
        expect_version("rollout", traj.policy_version, run.version)
    else:  # generated ahead (rl/ahead.py): by the step's version or at most rl.max_staleness before it, per token
        for v in sorted(all_versions(traj)):
            if not 0 <= run.version - v <= cfg.max_staleness:
                raise RuntimeError(f"rollout: produced by policy version {v} for step {run.step} at version "
                                   f"{run.version}: more than rl.max_staleness = {cfg.max_staleness} behind")
    check_finite("rollout log-probs", [x for row in traj.logprobs for x in row], step=run.step)
    return traj


def score(reward: ScoresWithFunctions, traj: Trajectories, cfg: RLConfig, run: StepRun, *,
          scorers: tuple[Scorer, ...] = ()) -> tuple[Rewards, dict]:
    """The samples' rewards and their metrics: the reward functions' (or verifier's) scores x `reward.weight`
    (reward.fn_weight) plus every scoring role's weighted scores (`scorers`, each timed as its own phase). The
    functions' own mean and accuracy are always reported (reward/fn_mean, reward/fn_accuracy), so a run trained
    on a reward model alone still shows what the verifier thinks; each scorer column's mean as reward/<name>_mean."""
    with run.phase("reward"):
        rewards = reward.score(traj)
    check_reward_failures(rewards, step=run.step, max_rate=cfg.max_reward_failure_rate)
    check_finite("rewards", rewards.scores, step=run.step)
    fn = rewards.scores
    metrics = {"reward/fn_mean": sum(fn) / len(fn), "reward/fn_accuracy": sum(s >= 1.0 for s in fn) / len(fn)}
    if not scorers:
        return rewards, metrics
    total, compute_s = [reward.weight * f for f in fn], rewards.compute_s
    for scorer in scorers:
        with run.phase(scorer.role):
            sc = scorer.score(traj)
        for name, source, col in zip(sc.names, sc.sources, sc.scores):
            check_finite(f"{scorer.role} {name} ({source}) scores", col, step=run.step)
            metrics[f"reward/{name}_mean"] = sum(col) / len(col)
        total = [a + b for a, b in zip(total, scorer.weighted(sc))]
        compute_s += sc.compute_s
    mixed = Rewards(policy_version=rewards.policy_version, scores=total, failures=rewards.failures,
                    scorer=rewards.scorer, compute_s=compute_s)
    return mixed, metrics


def reference_logprobs(reference: GivesLogProbs | None, traj: Trajectories, cfg: RLConfig, run: StepRun) -> LogProbs | None:
    """The frozen start model's log-probs of the samples; None when the run has no reference role."""
    if reference is None:
        return None
    with run.phase("reference"):
        ref = reference.log_probs(traj, temperature=cfg.temperature)
    check_finite("reference log-probs", [x for row in ref.values for x in row], step=run.step)
    return ref


def update_policy(policy: TrainsPolicy, batch: TrainBatch, cfg: RLConfig, run: StepRun, *, rollout: Generates
                  ) -> UpdateStats:
    """One SPMD policy update. Before it both sides hold version v, so its first forward compares the rollout
    engine with the policy on identical weights - the drift check of the previous step's weight sync, end to
    end (samples generated ahead, rl.max_staleness: the policy ranks compare each row at the version that
    generated it); the drift gate and the non-finite gates stop it before its optimizer step."""
    check_finite("advantages", [x for row in batch.advantages for x in (row if isinstance(row, list) else [row])],
                 step=run.step)
    with run.phase("update"):
        stats = policy.update(batch, drift_threshold=cfg.drift_threshold)
    drift_gate(stats.drift, version=run.version, threshold=cfg.drift_threshold,
               rollout_workers=rollout.identities())
    if not stats.applied:
        raise NonFiniteError(f"step {run.step}: stage policy.update stopped before the optimizer step: "
                             f"{stats.stopped}; weights stay at version {run.version}, no checkpoint written")
    expect_version("policy update", stats.policy_version, run.version + 1)
    return stats


def check_finite(what: str, values: list[float], *, step: int) -> None:
    bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
    if bad is not None:
        raise NonFiniteError(f"step {step}: {what} hold {values[bad]} (value {bad} of {len(values)}); stopped "
                             "before the policy update, no checkpoint written")


def check_reward_failures(rewards: Rewards, *, step: int, max_rate: float) -> None:
    failed = [f for f in rewards.failures if f is not None]
    n = len(rewards.failures)
    if n and len(failed) / n > max_rate:
        raise RewardFailureError(
            f"reward function {rewards.scorer}: {len(failed)}/{n} calls failed at step {step} "
            f"({len(failed) / n:.0%} > rl.max_reward_failure_rate = {max_rate:g}); e.g. {failed[0]}")


def expect_version(stage: str, got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"{stage}: produced policy version {got}, expected {want} (a stale or skipped update)")


def response_mask(traj: Trajectories) -> torch.Tensor:
    """(B, R) bool: True at each row's tokens the policy sampled - its whole response, or the sampled ones of a
    multi-turn episode (`traj.sampled`) - R the longest response, at least 1."""
    B = len(traj.response_ids)
    return loss_mask(traj, 0, B, (B, max(max(len(x) for x in traj.response_ids), 1)))


def advantage_metrics(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """adv/mean, adv/std, adv/min, adv/max over the valid tokens of (B, R) per-token advantages."""
    a = adv[mask]
    return {"adv/mean": float(a.mean()), "adv/std": float(a.std()) if a.numel() > 1 else 0.0,
            "adv/min": float(a.min()), "adv/max": float(a.max())}
