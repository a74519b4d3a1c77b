"""The pass-rate curriculum (`data.pass_rate.refresh_every`): every N steps the policy being trained re-measures
the pass rate of every prompt the selection sampled, and RL draws from those now inside the band.

The selection before RL (posttrain.eval.pass_rate) measured the start model; its dataset then holds the pool
(`pool.jsonl`: every sampled train row, in order) and, in `info.json`, each one's rate, the band and the refresh
interval. The RL run's train rows are the pool, and its sampler starts on the pool rows the start model left in
the band. At the start of every step after a multiple of N, the controller calls `refresh`: the rollout workers
sample `samples_per_prompt` answers to each pool prompt with the policy's current weights and RL's sampling
settings, the reward workers score them (score >= 1 passes, as RL's accuracy counts; a failed call does not
pass), and the sampler is narrowed to the prompts whose rate lies strictly inside the band. A refresh that
leaves no prompt in the band keeps the previous ones (and says so). The refresh runs with the step's own seed
stream (the controller's RNG), so a resumed run refreshes exactly as the uninterrupted one.

    curriculum = Curriculum.read(dataset_dir)             # None: the selection asked for no refreshes
    examples = curriculum.pool                            # the run's train rows
    sampler.set_active(curriculum.start_rows(sampler))    # the start model's selection
    metrics, compute_s = curriculum.refresh(sampler, rollout, reward, rl_cfg, step=n, version=v, seed=s)  # every N
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config import RLConfig
from posttrain.data.examples import read_examples
from posttrain.rl.loops.common import check_reward_failures


@dataclass(frozen=True, kw_only=True)
class Curriculum:
    every: int
    """Refresh at the start of every step after a multiple of this many steps."""
    samples_per_prompt: int
    min_rate: float
    max_rate: float
    pool: list[dict]
    """Every train row the selection sampled, in its order: the run's train rows."""
    start_rates: list[float]
    """The start model's pass rate of each pool row."""

    @classmethod
    def read(cls, dataset_dir: str | Path) -> Curriculum | None:
        """The curriculum a pass-rate selection's dataset asks for; None for any other dataset or no refreshes."""
        path = Path(dataset_dir) / "info.json"
        pr = (json.loads(path.read_text()).get("pass_rate") or {}) if path.is_file() else {}
        if not pr.get("refresh_every"):
            return None
        pool = read_examples(dataset_dir, "pool")
        if len(pool) != len(pr["rates"]):
            raise ValueError(f"{dataset_dir}: pool.jsonl holds {len(pool)} rows, info.json rates {len(pr['rates'])}")
        return cls(every=pr["refresh_every"], samples_per_prompt=pr["samples_per_prompt"], min_rate=pr["min_rate"],
                   max_rate=pr["max_rate"], pool=pool, start_rates=[r for _, r in pr["rates"]])

    def in_band(self, rate: float) -> bool:
        return self.min_rate < rate < self.max_rate

    def start_rows(self, sampler) -> list[int]:
        """The pool rows the start model left in the band (among those the sampler can use)."""
        usable = set(sampler.rows)
        return [i for i, r in enumerate(self.start_rates) if self.in_band(r) and i in usable]

    def due(self, steps_done: int) -> bool:
        """Whether the step after `steps_done` finished steps starts with a refresh."""
        return steps_done > 0 and steps_done % self.every == 0

    def refresh(self, sampler, rollout: Any, reward: Any, cfg: RLConfig, *, step: int, version: int, seed: int
                ) -> tuple[dict[str, float], float]:
        """Re-measure every usable pool prompt under the rollout workers' weights (`version`), narrow the sampler
        to those in the band (before `step`; too many failed reward calls stop it as a step's would), and return the refresh's metrics (fractions of the usable pool) and the seconds
        the rollout and reward workers computed."""
        t0 = time.perf_counter()
        ids, k = list(sampler.rows), self.samples_per_prompt
        chunk = max(1, cfg.prompts_per_step * cfg.samples_per_prompt // k)  # a step's rollout rows per call
        rates: list[float] = []
        compute_s = 0.0
        for start in range(0, len(ids), chunk):
            batch = sampler.batch_of(ids[start:start + chunk], version)
            traj = rollout.generate(batch, n=k, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                    seed=seed + start, top_p=cfg.top_p, top_k=cfg.top_k)
            if traj.policy_version != version:
                raise RuntimeError(f"curriculum refresh: rollout produced version {traj.policy_version}, the policy "
                                   f"is at {version}")
            rewards = reward.score(traj)
            compute_s += traj.compute_s + rewards.compute_s
            check_reward_failures(rewards, step=step, max_rate=cfg.max_reward_failure_rate)
            passed = [0] * len(batch.example_ids)
            for g, score, failure in zip(traj.group_index, rewards.scores, rewards.failures):
                passed[g] += failure is None and score >= 1.0
            rates += [p / k for p in passed]
        kept = [i for i, r in zip(ids, rates) if self.in_band(r)]
        if kept:
            sampler.set_active(kept)
        else:
            print(f"curriculum refresh at policy version {version}: no prompt's pass rate lies strictly between "
                  f"{self.min_rate} and {self.max_rate}; RL keeps drawing from the {len(sampler.active)} prompts "
                  "kept before", flush=True)
        n = len(ids)
        print(f"curriculum refresh at policy version {version}: {len(kept)} of {n} prompts in the band "
              f"({sum(r == 0 for r in rates)} never solved, {sum(r == 1 for r in rates)} always; "
              f"{time.perf_counter() - t0:.1f}s)", flush=True)
        return {"pass_rate/in_band_fraction": len(kept) / n, "pass_rate/mean_rate": sum(rates) / n,
                "pass_rate/never_fraction": sum(r == 0 for r in rates) / n,
                "pass_rate/always_fraction": sum(r == 1 for r in rates) / n}, compute_s
