"""Reward role: score trajectories with the task's verifier (in-process, trusted code) or a user function
(`module:function`, run in a killable subprocess - see posttrain.rewards). Failures are recorded per
trajectory (score 0) and counted in the step metrics; they never crash or hang the run."""

from __future__ import annotations

import time

from posttrain.config import RewardConfig
from posttrain.data import verifiers
from posttrain.rl.dispatch import split_even
from posttrain.rewards import RewardSandbox
from posttrain.rl.remote import gather
from posttrain.rl.roles.common import single_threaded, where, worker_identity
from posttrain.rl.types import Rewards, Trajectories, WorkerId


class RewardWorker:
    def __init__(self, reward_cfg: RewardConfig, rank: int, world_size: int):
        single_threaded()
        self.id = worker_identity("reward", rank, world_size)
        self.sandbox = RewardSandbox(reward_cfg.fn, reward_cfg.timeout_s) if reward_cfg.fn else None

    def identity(self) -> WorkerId:
        return self.id

    def where(self) -> dict:
        return where()

    def score(self, texts: list[str], answers: list[str | None], tasks: list[str | None]) -> tuple:
        t0 = time.perf_counter()
        scores, failures = [], []
        for text, ans, task in zip(texts, answers, tasks):
            if self.sandbox is None:
                scores.append(verifiers.score(task, text, ans))
                failures.append(None)
            else:
                r = self.sandbox.score(text, ans, task)
                scores.append(r.score)
                failures.append(r.failure)
        return scores, failures, time.perf_counter() - t0


class RewardGroup:
    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float):
        self.workers, self.ids, self.timeout_s = workers, ids, timeout_s

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def score(self, trajectories: Trajectories) -> Rewards:
        t = trajectories
        parts = split_even(len(t.texts), len(self.workers))
        refs = [w.score.remote(t.texts[lo:hi], t.answers[lo:hi], t.tasks[lo:hi])
                for w, (lo, hi) in zip(self.workers, parts)]
        results = gather(refs, self.ids[:len(refs)], stage="reward.score", timeout_s=self.timeout_s)
        return Rewards(policy_version=t.policy_version, scores=[s for r in results for s in r[0]],
                       failures=[f for r in results for f in r[1]], compute_s=max(r[2] for r in results))
