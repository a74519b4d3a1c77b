"""Environment role: the multi-turn episodes' environments and tools (rl.environment / rl.tools). Each worker
runs one sandboxed tool process (posttrain.envs.process.ToolProcess: per-call time, CPU and memory limits; a
crashed or hung process is replaced and its open episodes replayed) holding the instances of the episodes it
was given, and answers finished turns with text (posttrain.envs.episodes.LocalEnv). The tokens never come
here: the controller's EpisodeRollout (rl/roles/episode_rollout.py) keeps them.

`EnvironmentGroup` is the batched EpisodeEnv over the workers - an episode opened on a worker stays there
(its instance lives in that worker's tool process) - and the role's scorer: an environment that rewards its
episodes (per-turn rewards from `step`, a final `get_reward`) adds them to the step's reward, as a learned
reward model does (registry `scores=True`): no loop names it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from posttrain.config import EpisodeConfig
from posttrain.envs.episodes import EnvReply, EpisodeEnd, LocalEnv
from posttrain.envs.plan import tool_limits
from posttrain.envs.process import ToolProcess
from posttrain.envs.tools import ToolSpec
from posttrain.rl.dispatch import split_even
from posttrain.rl.remote import gather
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.types import Scores, Trajectories, WorkerId


@dataclass(frozen=True, kw_only=True)
class EpisodeNotes:
    """What happened in one episode (Trajectories.notes, written by EpisodeRollout): the metrics' env/* and the
    environment's own reward, which this role scores with."""

    turns: int
    """Turns the policy sampled."""
    tool_calls: int
    """Tool calls it made (well-formed or not)."""
    failures: dict[str, int]
    """Failed calls by kind (the tool's: raised, timeout, died, ...; the model's own: bad_call)."""
    reward: float | None
    """The environment's own reward (its `step` rewards summed plus its `get_reward()`); None: an environment
    that gives none."""

    @classmethod
    def step_metrics(cls, notes: Sequence[Self], finished: Sequence[bool]) -> dict[str, float]:
        """A step's episode metrics: turns and tool calls per episode, the share that finished (answered before a
        limit), failed tool calls in the step (env/tool_errors; env/timeouts of them; env/failures/<kind> each
        kind: raised, timeout, died, out_of_memory, not_text, unknown_tool, bad_call)."""
        n = len(notes)
        out = {"env/turns_mean": sum(e.turns for e in notes) / n,
               "env/tool_calls_mean": sum(e.tool_calls for e in notes) / n,
               "env/finished": sum(finished) / n,
               "env/tool_errors": float(sum(sum(e.failures.values()) for e in notes)),
               "env/timeouts": float(sum(e.failures.get("timeout", 0) for e in notes))}
        for kind in sorted({k for e in notes for k in e.failures}):
            out[f"env/failures/{kind}"] = float(sum(e.failures.get(kind, 0) for e in notes))
        return out


class EnvironmentWorker:
    def __init__(self, environment: str, tools: list[str], episode: EpisodeConfig, rank: int, world_size: int):
        set_torch_threads()
        self.id = worker_identity("environment", rank, world_size)
        # a bad import path, a tool without types or docs fails here, naming it, before any step
        self.process = ToolProcess(environment, tools, episode.python_path, tool_limits(episode))
        self.env = LocalEnv(self.process)
        self.busy_s = 0.0

    def identity(self) -> WorkerId:
        return self.id

    def where(self) -> dict:
        return where()

    def describe(self) -> dict:
        """The tools' schemas, the source sha256 of the environment and each tool (for lineage), and whether the
        environment has `step` / `get_reward`."""
        return {"specs": [s.schema for s in self.process.specs], "identity": dict(self.process.identity),
                "has_step": self.process.has_step, "has_reward": self.process.has_reward}

    def open(self, keys: list[str], rows: list[dict]) -> list[str | None]:
        t0 = time.perf_counter()
        try:
            return self.env.open(keys, rows)
        finally:
            self.busy_s += time.perf_counter() - t0

    def respond(self, keys: list[str], texts: list[str]) -> list[EnvReply]:
        t0 = time.perf_counter()
        try:
            return self.env.respond(keys, texts)
        finally:
            self.busy_s += time.perf_counter() - t0

    def finish(self, keys: list[str]) -> tuple[list[EpisodeEnd], float, int]:
        """Each episode's end, then (seconds this worker spent on episodes since the last finish, tool-process
        restarts so far)."""
        t0 = time.perf_counter()
        ends = self.env.finish(keys)
        busy, self.busy_s = self.busy_s + time.perf_counter() - t0, 0.0
        return ends, busy, self.process.restarts

    def __del__(self) -> None:
        process = getattr(self, "process", None)
        if process is not None:
            process.shutdown()


class EnvironmentGroup:
    """Fan-out over environment workers, batched per turn: `open` splits the new episodes contiguously (and
    remembers where each went), `respond` and `finish` send each worker its own episodes' keys."""

    role = "environment"

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, source: str = "environment"):
        """`source`: the environment's (or tools') import path, as its reward column's source."""
        self.workers, self.ids, self.timeout_s, self.source = workers, ids, timeout_s, source
        self._owner: dict[str, int] = {}
        self._described: dict | None = None
        self.compute_s = 0.0
        """Worker-timed seconds of the episodes finished since EpisodeRollout last read it."""
        self.restarts = 0

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def _describe(self) -> dict:
        if self._described is None:  # every worker imported the same code: ask one
            self._described = gather([self.workers[0].describe.remote()], self.ids[:1], stage="environment.describe",
                                     timeout_s=self.timeout_s)[0]
        return self._described

    @property
    def specs(self) -> list[ToolSpec]:
        return [ToolSpec(name=s["function"]["name"], schema=s) for s in self._describe()["specs"]]

    @property
    def identity(self) -> dict[str, str]:
        """import path -> source sha256 of the environment and each tool."""
        return dict(self._describe()["identity"])

    @property
    def rewards(self) -> bool:
        """Whether the environment gives rewards of its own (`step` may, `get_reward` does)."""
        d = self._describe()
        return bool(d["has_step"] or d["has_reward"])

    def open(self, keys: Sequence[str], rows: Sequence[dict]) -> list[str | None]:
        parts = [(w, lo, hi) for w, (lo, hi) in enumerate(split_even(len(keys), len(self.workers))) if hi > lo]
        for w, lo, hi in parts:
            self._owner.update({k: w for k in keys[lo:hi]})
        refs = [self.workers[w].open.remote(list(keys[lo:hi]), list(rows[lo:hi])) for w, lo, hi in parts]
        out = gather(refs, [self.ids[w] for w, _, _ in parts], stage="environment.open", timeout_s=self.timeout_s)
        return [x for r in out for x in r]

    def _by_worker(self, keys: Sequence[str], stage: str, call: str, *per_key: Sequence) -> list[tuple[list[int], Any]]:
        """Each worker gets its own keys (and the matching items of `per_key`): [(positions in `keys`, its answer)]."""
        mine: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            mine.setdefault(self._owner[k], []).append(i)
        order = sorted(mine)
        refs = [getattr(self.workers[w], call).remote([keys[i] for i in mine[w]],
                                                     *[[xs[i] for i in mine[w]] for xs in per_key]) for w in order]
        results = gather(refs, [self.ids[w] for w in order], stage=stage, timeout_s=self.timeout_s)
        return [(mine[w], r) for w, r in zip(order, results)]

    @staticmethod
    def _in_order(n: int, parts: list[tuple[list[int], list]]) -> list:
        out: list = [None] * n
        for positions, values in parts:
            for i, x in zip(positions, values):
                out[i] = x
        return out

    def respond(self, keys: Sequence[str], texts: Sequence[str]) -> list[EnvReply]:
        if not keys:
            return []
        return self._in_order(len(keys), self._by_worker(keys, "environment.respond", "respond", texts))

    def finish(self, keys: Sequence[str]) -> list[EpisodeEnd]:
        if not keys:
            return []
        parts = self._by_worker(keys, "environment.finish", "finish")
        self.compute_s += max(busy for _, (_, busy, _) in parts)
        self.restarts = max([self.restarts, *(restarts for _, (_, _, restarts) in parts)])
        for k in keys:
            self._owner.pop(k, None)
        return self._in_order(len(keys), [(positions, ends) for positions, (ends, _, _) in parts])

    # ---- as a scorer (registry scores=True): the environment's own rewards join the step's reward

    def score(self, trajectories: Trajectories) -> Scores:
        """The episodes' own rewards, read when each ended (EpisodeRollout put them in the trajectories' notes): the
        column `env` (reward/env_mean), 0 for every episode of an environment that gives none."""
        t = trajectories
        col = [(n.reward or 0.0) if isinstance(n, EpisodeNotes) else 0.0
               for n in t.notes or [None] * len(t.response_ids)]
        return Scores(policy_version=t.policy_version, names=["env"], sources=[self.source], scores=[col],
                      compute_s=0.0)

    def weighted(self, scores: Scores) -> list[float]:
        """(B,) the environment's rewards as they are: added to reward.fn_weight x the functions' scores."""
        return list(scores.scores[0])
