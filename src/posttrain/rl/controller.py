"""The RL controller: one GRPO step, top to bottom, over four role groups it only knows by Protocol.

    PromptSampler ──PromptBatch(v)──► rollout.generate (n per prompt) ──Trajectories(v)──┐
                                                                                        │
        ┌─── reward.score ──Rewards──► grpo.group_advantages ──Advantages──┐    reference.log_probs
        │                                                                  │    (only if kl_coef > 0)
        │                                                                  ▼            │
        │              TrainBatch(v) = tokens + rollout logprobs + advantages + ref ◄───┘
        │                                     │
        │                              policy.update (SPMD, every rank) ──UpdateStats(v+1)
        │                                first forward at v: drift vs rollout logprobs (checks the
        │                                previous sync end to end); gates before the optimizer step
        │                                     │
        └──── rollout.load_weights ◄── policy.weights() = WeightsHandle(v+1, checksum)
              └─► WeightReport per rollout worker: version AND checksum must equal the handle's,
                  else StaleWeightsError naming the worker

`Controller.step()` returns a frozen `StepMetrics`; `Controller.run(steps)` calls `start()` (resume + first
weight sync) and loops, checkpointing every
`rl.checkpoint_every` steps and after the last, and resumes from the checkpointer's newest state first.
The same class runs in-process (tests drive it with the in-process groups of tests/rl_fakes.py) or inside
ONE Ray actor that holds the real groups (`posttrain.rl.run`). Fan-out is the groups' business: every call below goes to a
whole group, which shards, calls its workers and merges.

A step stops with `RewardFailureError` (naming the function, the failure count, the step and one reason)
when more than `rl.max_reward_failure_rate` of its reward calls failed - before the update, so no weights
are trained on a broken reward. It stops with `NonFiniteError` (naming the step, the stage and the tensor)
on a non-finite rollout log-prob, reward, reference log-prob or advantage (before the update) or loss or
gradient norm (the update stops before its optimizer step), and with `WeightDriftError` when the update
measured drift above `rl.drift_threshold` or NaN (also before its optimizer step); either way no checkpoint
holds the poisoned step.

Leaves out: asynchronous / off-policy rollouts (generation waits for the sync), a critic (PPO), and
dynamic batch filtering (groups whose rewards are all equal simply get zero advantage).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from posttrain.config import RLConfig
from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.metrics import StepMetrics, step_metrics
from posttrain.rl.state import Checkpointer, PromptSampler
from posttrain.rl.types import (
    Advantages,
    PolicyGroup,
    ReferenceGroup,
    RewardGroup,
    Rewards,
    RolloutGroup,
    TrainBatch,
)
from posttrain.rl.weight_sync import drift_gate, verify_reports


@dataclass(frozen=True)
class RoleGroups:
    rollout: RolloutGroup
    reward: RewardGroup
    reference: ReferenceGroup | None
    """None when rl.kl_coef == 0."""
    policy: PolicyGroup


class StepTracker(Protocol):
    def log(self, m: StepMetrics) -> None: ...

    def close(self, model_id: str | None = None, *, failed: bool = False) -> None:
        """End of the run: `model_id` is the final model's id (None when nothing was stored)."""


class Controller:
    def __init__(self, rl_cfg: RLConfig, groups: RoleGroups, prompt_sampler: PromptSampler, tracker: StepTracker,
                 checkpointer: Checkpointer | None):
        if (rl_cfg.kl_coef > 0) != (groups.reference is not None):
            raise ValueError(f"rl.kl_coef = {rl_cfg.kl_coef} needs a reference group exactly when it is > 0")
        self.cfg, self.groups, self.sampler = rl_cfg, groups, prompt_sampler
        self.tracker, self.checkpointer = tracker, checkpointer
        self.step_count, self.version = 0, 0
        self.rng = random.Random(rl_cfg.seed)
        self.history: list[StepMetrics] = []
        self.started = False
        self.stage = "start"
        """What the controller is doing now ("start", a phase of a step, "save", "done"): read by the driver's
        watchdog from another thread of the controller actor."""
        self.model_id: str | None = None
        """Artifact id of the newest saved model (None before the first checkpoint)."""

    # ------------------------------------------------------------------------------------- one step

    def step(self) -> StepMetrics:
        if not self.started:
            raise RuntimeError("Controller.step() before start(): the rollout workers hold no verified weights yet")
        cfg, g, v = self.cfg, self.groups, self.version
        t_step = time.perf_counter()
        phase: dict[str, float] = {}  # wall seconds per phase, as the controller sees them

        with self._phase(phase, "rollout"):
            prompts = self.sampler.next_batch(policy_version=v)
            traj = g.rollout.generate(prompts, n=cfg.samples_per_prompt, temperature=cfg.temperature,
                                      max_new_tokens=cfg.max_new_tokens, seed=self.rng.randrange(2**31),
                                      top_p=cfg.top_p, top_k=cfg.top_k)
        _expect_version("rollout", traj.policy_version, v)

        _check_finite("rollout log-probs", [x for row in traj.logprobs for x in row], step=self.step_count + 1)

        with self._phase(phase, "reward"):
            rewards = g.reward.score(traj)
        _check_reward_failures(rewards, step=self.step_count + 1, max_rate=cfg.max_reward_failure_rate)
        _check_finite("rewards", rewards.scores, step=self.step_count + 1)

        ref = None
        if g.reference is not None:
            with self._phase(phase, "reference"):
                ref = g.reference.log_probs(traj, temperature=cfg.temperature)
            _check_finite("reference log-probs", [x for row in ref.values for x in row], step=self.step_count + 1)

        with self._phase(phase, "advantages"):
            adv = group_advantages(torch.tensor(rewards.scores), cfg.samples_per_prompt,
                                   std_normalize=cfg.std_normalize)
            advantages = Advantages(policy_version=v, values=adv.tolist())
        _check_finite("advantages", advantages.values, step=self.step_count + 1)

        with self._phase(phase, "update"):
            batch = TrainBatch(policy_version=v, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                               old_logprobs=traj.logprobs, ref_logprobs=ref.values if ref else None,
                               advantages=advantages.values)
            # SPMD: every policy rank runs the same update on its shard. Before the update both sides hold
            # version v, so its first forward compares the rollout engine with the policy on identical
            # weights - the drift check of the previous step's weight sync, end to end.
            stats = g.policy.update(batch, drift_threshold=cfg.drift_threshold)
        drift_gate(stats.drift, version=v, threshold=cfg.drift_threshold, rollout_workers=g.rollout.identities())
        if not stats.applied:
            raise NonFiniteError(f"step {self.step_count + 1}: stage policy.update stopped before the optimizer "
                                 f"step: {stats.stopped}; weights stay at version {v}, no checkpoint written")
        _expect_version("policy update", stats.policy_version, v + 1)

        with self._phase(phase, "sync"):
            self._push_weights(stats.policy_version, checksum=stats.weights_checksum)

        self.version, self.step_count = stats.policy_version, self.step_count + 1
        m = step_metrics(step=self.step_count, traj=traj, rewards=rewards, ref=ref, stats=stats, phase_s=phase,
                         step_s=time.perf_counter() - t_step)
        self.history.append(m)
        return m

    def _phase(self, phase_s: dict[str, float], name: str):
        self.stage = name
        return _timed(phase_s, name)

    def _push_weights(self, version: int, checksum: str | None = None) -> None:
        """Hand the policy's weights to every rollout worker; each must report back exactly this version and
        the handle's checksum (`verify_reports` names any worker that does not)."""
        handle = self.groups.policy.weights()
        if handle.version != version or (checksum is not None and handle.checksum != checksum):
            want = f"version {version}" + (f" checksum {checksum[:12]}" if checksum is not None else "")
            raise RuntimeError(f"policy.weights() returned version {handle.version} checksum "
                               f"{handle.checksum[:12]}, expected {want}")
        reports = self.groups.rollout.load_weights(handle)
        verify_reports(handle, reports, self.groups.rollout.identities())

    # ------------------------------------------------------------------------------------- the loop

    def start(self) -> None:
        """Restore the newest checkpoint (policy state, sampler cursor, step, RNG), then push the policy's
        weights to the rollout workers - also on a fresh start, so both sides provably hold version 0. First of
        all, the reward group checks that its function can be called with the dataset's columns."""
        self.groups.reward.check_arguments(self.sampler.column_names())
        state = self.checkpointer.restore(self.groups.policy) if self.checkpointer else None
        if state is not None:
            self.step_count, self.version = state.step, state.policy_version
            self.sampler.load_state_dict(state.sampler)
            self.rng.setstate(_rng_from_json(state.rng_state))
            self.model_id = state.model_id
            self.history = [StepMetrics(**_unflatten(h)) for h in state.history]
            print(f"rl: resumed at step {state.step} (policy version {state.policy_version})", flush=True)
        self._push_weights(self.version)
        self.started = True

    def run(self, steps: int) -> list[StepMetrics]:
        """Run until `steps` updates are done (counting those before a resume); returns the full history."""
        every = self.cfg.checkpoint_every
        try:
            if not self.started:
                self.start()
            while self.step_count < steps:
                m = self.step()
                if self.checkpointer:
                    self.checkpointer.record(m)
                self.tracker.log(m)
                if self.step_count == steps or (every and self.step_count % every == 0):
                    self.save()
            if self.checkpointer and self.model_id is None:  # resumed a finished run that never saved
                self.save()
        except BaseException:
            self.tracker.close(failed=True)
            raise
        self.tracker.close(self.model_id)
        return self.history

    def save(self) -> None:
        if self.checkpointer is None:
            return
        self.stage = "save"
        state = {"sampler": self.sampler.state_dict(), "rng_state": _rng_to_json(self.rng.getstate()),
                 "wandb_id": getattr(self.tracker, "wandb_id", None)}
        ref = self.checkpointer.save(step=self.step_count, policy_version=self.version, policy=self.groups.policy,
                                     controller_state=state, history=[m.flat() for m in self.history])
        self.model_id = ref.id


@contextmanager
def _timed(phase_s: dict[str, float], name: str) -> Iterator[None]:
    """Record the wall seconds of the `with` body as phase `name` (not recorded when the body raises)."""
    t = time.perf_counter()
    yield
    phase_s[name] = time.perf_counter() - t


class RewardFailureError(RuntimeError):
    """Too many reward calls of one step failed: the rewards would be mostly zeros, so training stops."""


class NonFiniteError(RuntimeError):
    """A NaN or infinity in a step's numbers: the step stopped before the optimizer step and any checkpoint."""


def _check_finite(what: str, values: list[float], *, step: int) -> None:
    bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
    if bad is not None:
        raise NonFiniteError(f"step {step}: {what} hold {values[bad]} (value {bad} of {len(values)}); stopped "
                             "before the policy update, no checkpoint written")


def _check_reward_failures(rewards: Rewards, *, step: int, max_rate: float) -> None:
    failed = [f for f in rewards.failures if f is not None]
    n = len(rewards.failures)
    if n and len(failed) / n > max_rate:
        raise RewardFailureError(
            f"reward function {rewards.scorer}: {len(failed)}/{n} calls failed at step {step} "
            f"({len(failed) / n:.0%} > rl.max_reward_failure_rate = {max_rate:g}); e.g. {failed[0]}")


def _expect_version(stage: str, got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"{stage}: produced policy version {got}, expected {want} (a stale or skipped update)")


def _rng_to_json(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def _unflatten(flat: dict) -> dict:
    """Inverse of StepMetrics.flat()."""
    out = {k: v for k, v in flat.items() if "/" not in k}
    out["phase_s"] = {k[5:-2]: v for k, v in flat.items() if k.startswith("time/")}
    out["compute_s"] = {k[8:-2]: v for k, v in flat.items() if k.startswith("compute/")}
    return out
