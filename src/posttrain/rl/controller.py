"""The RL controller: the run's loop around one algorithm's step - resume, weight sync, metrics, checkpoints.

    Controller.run(steps):
        start(): restore the newest checkpoint into every training role, push the policy's weights (version v)
        loop:    [every data.pass_rate.refresh_every steps: curriculum.refresh(sampler, rollout, reward)]
                 prompts = sampler.next_batch(v)
                 outcome = algorithm.step(prompts, run)            # rl/loops/<algorithm>.py, top to bottom
                 rollout.load_weights ◄── policy.weights() = WeightsHandle(v+1, checksum)
                     └─► WeightReport per rollout worker: version AND checksum must equal the handle's,
                         else StaleWeightsError naming the worker
                 metrics, tracker, checkpoint every rl.checkpoint_every steps and after the last

The algorithm is chosen by `rl.algorithm` (`loops.ALGORITHMS`) and reads the role groups it names in its
`Roles` dataclass, filled here from the run's groups by name: the controller itself names only the policy and
the rollout, the two ends of the weight sync. The same class runs in-process (tests drive it with the
in-process groups of tests/rl_fakes.py) or inside ONE Ray actor that holds the real groups (`posttrain.rl.run`).
Fan-out is the groups' business: every call goes to a whole group, which shards, calls its workers and merges.

The gates of a step (reward failures, non-finite numbers, drift, version) live with the phases in
loops/common.py, so every algorithm has them; none lets a poisoned step reach a checkpoint.

With rl.max_staleness = k > 0 the rollout runs ahead (rl/ahead.py): the step takes the prompts drawn k draws
before, whose generation ran while the previous steps updated; the loop's rollout group is `AheadRollout`
(which hands over that generation), and each new version's weight load queues behind the draws in flight.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from posttrain.config import RLConfig
from posttrain.rl.ahead import Ahead, AheadRollout
from posttrain.rl.curriculum import Curriculum
from posttrain.rl.loops import ALGORITHMS
from posttrain.rl.loops.common import NonFiniteError, RewardFailureError, StepRun  # noqa: F401 - re-exported
from posttrain.rl.metrics import StepMetrics, step_metrics
from posttrain.rl.ragged import per_token_versions
from posttrain.rl.roles.registry import scoring_groups, uses_reference
from posttrain.rl.state import Checkpointer, PromptSampler
from posttrain.rl.weight_sync import verify_reports


class StepTracker(Protocol):
    def log(self, m: StepMetrics) -> None: ...

    def close(self, model_id: str | None = None, *, failed: bool = False) -> None:
        """End of the run: `model_id` is the final model's id (None when nothing was stored)."""


class Controller:
    def __init__(self, rl_cfg: RLConfig, groups: Mapping[str, Any], prompt_sampler: PromptSampler,
                 tracker: StepTracker, checkpointer: Checkpointer | None, curriculum: Curriculum | None = None):
        """`groups`: role name -> group (rl/roles/registry.py names; a role the run does not create is absent).
        `curriculum`: re-measure the prompts' pass rates every few steps (rl/curriculum.py; the sampler already
        draws from the start model's selection)."""
        if uses_reference(rl_cfg) != (groups.get("reference") is not None):
            raise ValueError(f"rl.kl_coef = {rl_cfg.kl_coef} needs a reference group exactly when it is > 0")
        if curriculum is not None and rl_cfg.max_staleness > 0:
            raise ValueError("data.pass_rate.refresh_every: not with rl.max_staleness > 0 (draws generated ahead "
                             "would come from the prompts kept before a refresh)")
        self.curriculum = curriculum
        self.cfg, self.groups, self.sampler = rl_cfg, dict(groups), prompt_sampler
        self.tracker, self.checkpointer = tracker, checkpointer
        self.step_count, self.version = 0, 0
        self.rng = random.Random(rl_cfg.seed)
        self.ahead: Ahead | None = None
        """The draws in flight with rl.max_staleness > 0 (None: synchronous)."""
        loop_groups = self.groups
        if rl_cfg.max_staleness > 0:
            self.ahead = Ahead(rl_cfg, self.groups["rollout"], lambda v: self.sampler.next_batch(policy_version=v),
                               self.rng)
            loop_groups = {**self.groups, "rollout": AheadRollout(self.ahead, self.groups["rollout"])}
        self.algorithm = make_algorithm(rl_cfg, loop_groups)
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
        t_step = time.perf_counter()
        phase: dict[str, float] = {}  # wall seconds per phase, as the controller sees them
        draw = (lambda: self.ahead.take(self.version)) if self.ahead else (
            lambda: self.sampler.next_batch(policy_version=self.version))
        refreshed, refresh_s = self._refresh(phase) if self.curriculum is not None else ({}, None)
        run = StepRun(step=self.step_count + 1, version=self.version, seed=self.rng.randrange(2**31),
                      phase=lambda name: self._phase(phase, name), draw=draw)
        with self._phase(phase, "rollout"):  # the sampler's time counts as the rollout's: drawing prompts is part of producing them
            prompts = draw()
        out = self.algorithm.step(prompts, run)
        out.extra.update(refreshed)
        if refresh_s is not None:  # the workers' seconds re-measuring the pool: compute, not orchestration
            out.compute_s["pass_rate"] = refresh_s
        if self.ahead:
            out.extra.update(self._ahead_metrics(out.traj))
        if out.stats is not None:  # None: this step trained no policy (e.g. PPO's critic warm-up)
            with self._phase(phase, "sync"):
                self._push_weights(out.stats.policy_version, checksum=out.stats.weights_checksum)
            self.version = out.stats.policy_version
        self.step_count += 1
        m = step_metrics(step=self.step_count, outcome=out, version=self.version, phase_s=phase,
                         step_s=time.perf_counter() - t_step)
        self.history.append(m)
        return m

    def _refresh(self, phase_s: dict[str, float]) -> tuple[dict[str, float], float | None]:
        """The curriculum's metrics for this step - the share of the pool drawn from (`pass_rate/kept_fraction`),
        after re-measuring every pool prompt under the current weights when a refresh is due - and the workers'
        seconds of that refresh (None: none was due)."""
        out, compute_s = {}, None
        if self.curriculum.due(self.step_count):
            with self._phase(phase_s, "pass_rate"):
                out, compute_s = self.curriculum.refresh(self.sampler, self.groups["rollout"], self.groups["reward"],
                                                         self.cfg, step=self.step_count + 1, version=self.version,
                                                         seed=self.rng.randrange(2**31))
        return {**out, "pass_rate/kept_fraction": len(self.sampler.active) / len(self.sampler.rows)}, compute_s

    def _phase(self, phase_s: dict[str, float], name: str):
        self.stage = name
        return _timed(phase_s, name)

    def _ahead_metrics(self, traj) -> dict[str, float]:
        """async/staleness_mean and _max: versions between the step's policy and the ones that sampled its
        tokens, over the sampled tokens (per_token_versions); async/in_flight: draws generating; with
        rl.new_weights_between_turns, async/switched_rows: the share of rows whose episode took a new version
        between its turns."""
        per_token = per_token_versions(traj)
        masks = traj.sampled if traj.sampled is not None else [[1] * len(r) for r in traj.response_ids]
        lags = [self.version - v for row, mask in zip(per_token, masks) for v, m in zip(row, mask) if m]
        row_lag = [self.version - v for v in traj.versions or [traj.policy_version] * len(traj.response_ids)]
        out = {"async/staleness_mean": sum(lags) / max(len(lags), 1),
               "async/staleness_max": float(max(lags + row_lag)), "async/in_flight": float(self.ahead.in_flight())}
        if self.cfg.new_weights_between_turns:
            out["async/switched_rows"] = sum(len(set(row)) > 1 for row in per_token) / max(len(per_token), 1)
        return out

    def _push_weights(self, version: int, checksum: str | None = None) -> None:
        """Hand the policy's weights to every rollout worker; each must report back exactly this version and
        the handle's checksum (`verify_reports` names any worker that does not). Rollout ahead: the load queues
        behind the draws in flight, once the previous one is done (its file released), and is verified there."""
        if self.ahead:  # its file may go: at most k - 1 older loads stay queued (weight_transfer.write keeps them)
            self.ahead.settle(outstanding=self.cfg.max_staleness - 1)
        handle = self.groups["policy"].weights()
        if handle.version != version or (checksum is not None and handle.checksum != checksum):
            want = f"version {version}" + (f" checksum {checksum[:12]}" if checksum is not None else "")
            raise RuntimeError(f"policy.weights() returned version {handle.version} checksum "
                               f"{handle.checksum[:12]}, expected {want}")
        rollout = self.groups["rollout"]

        def load() -> None:
            verify_reports(handle, rollout.load_weights(handle), rollout.identities())

        if self.ahead:
            self.ahead.push(version, load)
        else:
            load()

    # ------------------------------------------------------------------------------------- the loop

    def start(self) -> None:
        """Restore the newest checkpoint (policy state, sampler cursor, step, RNG), then push the policy's
        weights to the rollout workers - also on a fresh start, so both sides provably hold version 0. First of
        all, the reward group checks that its function can be called with the dataset's columns."""
        self.groups["reward"].check_arguments(self.sampler.column_names())
        # a checkpoint written under another bound is refused before any group loads its state
        draws = _in_flight(self.checkpointer.latest() if self.checkpointer else None, self.cfg.max_staleness)
        state = self.checkpointer.restore(self.groups) if self.checkpointer else None
        if state is not None:
            self.step_count, self.version = state.step, state.policy_version
            self.sampler.load_state_dict(state.sampler)
            self.rng.setstate(_rng_from_json(state.rng_state))
            self.model_id = state.model_id
            self.history = [StepMetrics(**_unflatten(h)) for h in state.history]
            print(f"rl: resumed at step {state.step} (policy version {state.policy_version})", flush=True)
        self._push_weights(self.version)
        if self.ahead:
            self.ahead.settle()  # version 0 (or the resumed one) verified before any draw is generated with it
            self.ahead.start(self.version, draws)
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
            if self.ahead:
                self.ahead.settle()  # the last version's load verified, as the synchronous loop's is
        except BaseException:
            self.tracker.close(failed=True)
            raise
        finally:
            if self.ahead:
                self.ahead.close()
        self.tracker.close(self.model_id)
        return self.history

    def save(self) -> None:
        if self.checkpointer is None:
            return
        self.stage = "save"
        if self.ahead:  # every version's load verified before a checkpoint holds it, as in the synchronous loop
            self.ahead.settle()
        state = {"sampler": self.sampler.state_dict(), "rng_state": _rng_to_json(self.rng.getstate()),
                 "wandb_id": getattr(self.tracker, "wandb_id", None),
                 **({"ahead": {"max_staleness": self.cfg.max_staleness, **self.ahead.state_dict()}}
                    if self.ahead else {})}
        ref = self.checkpointer.save(step=self.step_count, policy_version=self.version, groups=self.groups,
                                     controller_state=state, history=[m.flat() for m in self.history],
                                     transcripts=self.history[-1].transcripts if self.history else [])
        self.model_id = ref.id


@contextmanager
def _timed(phase_s: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall seconds of the `with` body to phase `name` (not recorded when the body raises)."""
    t = time.perf_counter()
    yield
    phase_s[name] = phase_s.get(name, 0.0) + time.perf_counter() - t


def _in_flight(state, max_staleness: int) -> list[dict]:
    """The draws in flight a checkpoint holds; refused when it was written with another rl.max_staleness (its
    samples' versions follow that bound)."""
    if state is None:
        return []
    saved = state.ahead or {"max_staleness": 0, "draws": []}
    if saved["max_staleness"] != max_staleness:
        raise ValueError(f"resume: the checkpoint of step {state.step} was written with rl.max_staleness = "
                         f"{saved['max_staleness']}, this run has {max_staleness}: resume with the same setting")
    return saved["draws"]


def _rng_to_json(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def _unflatten(flat: dict) -> dict:
    """Inverse of StepMetrics.flat()."""
    out = {k: v for k, v in flat.items() if "/" not in k}
    out["phase_s"] = {k[5:-2]: v for k, v in flat.items() if k.startswith("time/")}
    out["compute_s"] = {k[8:-2]: v for k, v in flat.items() if k.startswith("compute/")}
    out["extra"] = {k: v for k, v in flat.items() if "/" in k and not k.startswith(("time/", "compute/"))}
    return out


def make_algorithm(cfg: RLConfig, groups: Mapping[str, Any]):
    """The loop of `rl.algorithm` over the groups its `Roles` dataclass names (an absent optional one: None);
    `scorers` are the run's scoring groups (registry `scores=True`)."""
    cls = ALGORITHMS[cfg.algorithm].loop
    groups = {**groups, "scorers": scoring_groups(groups)}
    fields = dataclasses.fields(cls.Roles)
    missing = [f.name for f in fields if f.default is dataclasses.MISSING and groups.get(f.name) is None]
    if missing:
        raise ValueError(f"rl.algorithm {cfg.algorithm.value!r} needs the role groups {missing}; "
                         f"this run has {sorted(groups)}")
    return cls(cfg, cls.Roles(**{f.name: groups.get(f.name) for f in fields}))
