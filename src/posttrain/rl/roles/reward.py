"""Reward role: score trajectories through `posttrain.rewards.RewardScorer` - the task's verifier
(in-process, trusted code) or the user's `reward.fn` in a killable child process per worker, with the same
call convention, timeout and failure rules as eval. Failures are recorded per trajectory (score 0, with the
reason); the controller counts them, prints them and stops the run above `rl.max_reward_failure_rate`.

`RewardGroup` splits the trajectories contiguously across workers (a batch-style function sees whole
groups of samples), gathers with the remote timeout and merges in order. Leaves out: scoring that needs
the tokens (a reward function sees text only).
"""

from __future__ import annotations

import time

from posttrain.config import RewardConfig
from posttrain.rewards import RewardSample, RewardScorer
from posttrain.rl.dispatch import split_even
from posttrain.rl.remote import gather
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.types import Rewards, Trajectories, WorkerId


class RewardWorker:
    def __init__(self, reward_cfg: RewardConfig, rank: int, world_size: int):
        set_torch_threads()
        self.id = worker_identity("reward", rank, world_size)
        self.scorer = RewardScorer(reward_cfg)  # a bad name, path or import fails here, before any step

    def identity(self) -> WorkerId:
        return self.id

    def where(self) -> dict:
        return where()

    def check_arguments(self, columns: list[str]) -> str:
        """Raises if the function needs an argument no row supplies; returns the scorer's name."""
        self.scorer.check_arguments(columns)
        return self.scorer.name

    def score(self, samples: list[RewardSample]) -> tuple[list[float], list[str | None], float, str]:
        t0 = time.perf_counter()
        results = self.scorer.score(samples)
        return ([r.score for r in results], [r.failure for r in results], time.perf_counter() - t0,
                self.scorer.name)

    def __del__(self) -> None:
        scorer = getattr(self, "scorer", None)
        if scorer is not None:
            scorer.close()


class RewardGroup:
    """Fan-out over reward workers: shard trajectories -> .remote -> gather -> merge in order."""

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, weight: float = 1.0):
        """`weight`: reward.fn_weight, the functions' weight in the step's reward (loops.common.score)."""
        self.workers, self.ids, self.timeout_s, self.weight = workers, ids, timeout_s, weight

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def check_arguments(self, columns: list[str]) -> None:
        refs = [w.check_arguments.remote(list(columns)) for w in self.workers[:1]]  # all hold the same function
        gather(refs, self.ids[:1], stage="reward.check_arguments", timeout_s=self.timeout_s)

    def score(self, trajectories: Trajectories) -> Rewards:
        t = trajectories
        samples = [RewardSample(completion=text, messages=msgs, answer=ans, task=task, columns=cols)
                   for text, msgs, ans, task, cols in zip(t.texts, t.messages, t.answers, t.tasks, t.columns)]
        parts = split_even(len(samples), len(self.workers))
        refs = [w.score.remote(samples[lo:hi]) for w, (lo, hi) in zip(self.workers, parts)]
        results = gather(refs, self.ids[:len(refs)], stage="reward.score", timeout_s=self.timeout_s)
        return Rewards(policy_version=t.policy_version, scores=[s for r in results for s in r[0]],
                       failures=[f for r in results for f in r[1]], scorer=results[0][3],
                       compute_s=max(r[2] for r in results))
