"""Per-step RL metrics (`StepMetrics`) and where they go: the console and wandb.

`StepMetrics` is built once per step by the controller from the typed handoffs and the phase timings it
measured. Orchestration overhead is the share of the step's wall time in which no role worker was
computing, as timed by the workers themselves:

    overhead = 1 - (rollout + reward + reference + update compute seconds, worker-timed) / step wall time

so serialisation, object transfer, Ray scheduling, weight sync and the controller's own work all count as
overhead (the drift check costs nothing of its own: the update's first forward measures it).

`RLTracker` (posttrain.tracking.Tracker for StepMetrics) prints a tqdm bar when stdout is a terminal, else lines
paced by posttrain.tracking.progress (the first step, the last, every `tracking.log_every` steps when set, else every
`tracking.progress_every_s` seconds; with rate and ETA) - and a line for every step with failed reward calls,
whatever the pace, naming the count and one reason - and logs every step to the RL stage's wandb run
(posttrain.tracking.wandb_run; none with `tracking.wandb: false`), continuing the same wandb run id after a restart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from posttrain.config import TrackingConfig
from posttrain.rl.loops.common import StepOutcome
from posttrain.rl.ragged import trained_tokens
from posttrain.rl.types import Trajectories
from posttrain.tracking import Tracker
from posttrain.tracking.wandb_run import WandbRun


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    step: int
    """1-based number of this update."""
    policy_version: int
    """Policy version after the update (== step for a run that started at version 0)."""
    reward_mean: float
    reward_std: float
    accuracy: float
    """Fraction of samples with score >= 1."""
    reward_failures: int
    """Samples whose reward call failed (raised, timed out, died, returned a non-number; scored 0)."""
    num_samples: int = 0
    """Trajectories scored this step (0 in histories written before this field existed)."""
    reward_failure_example: str = ""
    """The first failure's reason ("" when none failed); shown on the console, not sent to wandb."""
    kl: float
    entropy: float
    clip_fraction: float
    loss: float
    grad_norm: float
    response_len_mean: float
    drift: float
    """Mean |rollout logprob - policy logprob| over this step's tokens at the version that sampled them."""
    generated_tokens: int
    generated_tokens_per_s: float
    """Generated tokens / rollout phase wall time (generated ahead, rl.max_staleness > 0: / the rollout workers'
    own generation time, the phase being only the wait for it)."""
    phase_s: dict[str, float]
    """Wall seconds per phase as seen by the controller: rollout, reward, reference, advantages, update, sync."""
    compute_s: dict[str, float]
    """Seconds each role computed, as timed inside its workers (max over a group's workers)."""
    step_s: float
    orchestration_overhead: float
    """1 - sum(compute_s) / step_s."""
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    """The algorithm's own metrics under their own names ("critic/value_loss", "adv/mean", ...)."""
    transcripts: list[dict] = dataclasses.field(default_factory=list)
    """The rows the rollout shows turn by turn (Trajectories.transcripts: a few multi-turn episodes), each
    {"prompt", "turns": [[who, text]...], "reward"}; not a number, so not in `flat()` (the RL model's manifest
    keeps the last step's under "episodes": the RL page shows them)."""

    def flat(self) -> dict[str, float | int]:
        """One flat dict of numbers (for wandb, console lines and manifests)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("phase_s", "compute_s", "reward_failure_example", "extra", "transcripts")}
        out.update({f"time/{k}_s": v for k, v in self.phase_s.items()})
        out.update({f"compute/{k}_s": v for k, v in self.compute_s.items()})
        out.update(self.extra)
        return out


def overhead(compute_s: dict[str, float], step_s: float, *, overlapped: bool = False) -> float:
    """`overlapped` (generation ahead of the update): 0 when the roles' compute adds up to more than the step's wall."""
    if step_s <= 0:
        return 0.0
    share = 1.0 - sum(compute_s.values()) / step_s
    return max(share, 0.0) if overlapped else share


def step_metrics(*, step: int, outcome: StepOutcome, version: int, phase_s: dict[str, float],
                 step_s: float) -> StepMetrics:
    """The StepMetrics of one finished step, from its outcome and the controller's phase timings. A step that
    trained no policy (PPO's critic warm-up) reports 0 for the update's numbers."""
    traj, rewards, ref, stats = outcome.traj, outcome.rewards, outcome.ref, outcome.stats
    compute = {"rollout": traj.compute_s, "reward": rewards.compute_s}
    if ref is not None:
        compute["reference"] = ref.compute_s
    compute.update(outcome.compute_s)
    if stats is not None:
        compute["update"] = stats.compute_s
    scores = rewards.scores
    mean = sum(scores) / len(scores)
    n_tokens = sum(trained_tokens(traj, i) for i in range(len(traj.response_ids)))  # sampled tokens only
    u = (stats.kl, stats.entropy, stats.clip_fraction, stats.loss, stats.grad_norm, stats.drift) if stats \
        else (0.0,) * 6
    # the rollout's wall, other roles' parts included; generated ahead (traj.versions), the rollout phase is only
    # the wait for a generation that ran during the previous steps: the workers' own generation time then
    tokens_per_s = n_tokens / max(phase_s["rollout"] if traj.versions is None else traj.compute_s, 1e-9)
    for role, seconds in traj.sub_phase_s.items():  # e.g. the environment's answers: its phase, not the rollout's
        phase_s = {**phase_s, "rollout": max(phase_s["rollout"] - seconds, 0.0),
                   role: phase_s.get(role, 0.0) + seconds}
    return StepMetrics(
        step=step, policy_version=version, reward_mean=mean,
        reward_std=(sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5,
        accuracy=sum(s >= 1.0 for s in scores) / len(scores),
        reward_failures=sum(f is not None for f in rewards.failures), num_samples=len(scores),
        reward_failure_example=next((f for f in rewards.failures if f is not None), ""),
        kl=u[0], entropy=u[1], clip_fraction=u[2], loss=u[3], grad_norm=u[4], drift=u[5],
        response_len_mean=n_tokens / len(traj.response_ids),
        generated_tokens=n_tokens, generated_tokens_per_s=tokens_per_s,
        phase_s=phase_s, compute_s=compute, step_s=step_s, orchestration_overhead=overhead(compute, step_s, overlapped=traj.versions is not None),
        extra={**outcome.extra, **notes_metrics(traj), **idle_metrics(traj, stats, step_s),
               **({"mismatch/kl": stats.mismatch_kl, "mismatch/max_abs_logp": stats.mismatch_max,
                   "update/skipped_rows": float(stats.skipped_rows)} if stats is not None else {})},
        transcripts=[{"prompt": traj.messages[i][-1]["content"] if traj.messages[i] else "",
                      "turns": [list(t) for t in turns], "reward": scores[i]} for i, turns in traj.transcripts])


def idle_metrics(traj: Trajectories, stats, step_s: float) -> dict[str, float]:
    """The bubble: the share of the step's wall time in which the rollout workers (one step's generation, worker
    timed) and the policy ranks (the update) computed nothing - in the synchronous loop each waits for the other;
    generated ahead (rl.max_staleness), the generation of the draws in flight overlaps the update."""
    if step_s <= 0:
        return {}
    out = {"idle/rollout": max(0.0, 1.0 - traj.compute_s / step_s)}
    if stats is not None:
        out["idle/update"] = max(0.0, 1.0 - stats.compute_s / step_s)
    return out


def notes_metrics(traj: Trajectories) -> dict[str, float]:
    """The metrics of the rows' notes (Trajectories.notes: a multi-turn episode's env/*), by their type's
    `step_metrics`; none for a rollout that leaves no notes."""
    if not traj.notes:
        return {}
    return type(traj.notes[0]).step_metrics(traj.notes, traj.finished)


def failure_line(m: StepMetrics) -> str:
    """'reward failures 3/64: ValueError: ...' for a step with failed reward calls, else ''."""
    if not m.reward_failures:
        return ""
    example = m.reward_failure_example if len(m.reward_failure_example) <= 200 else m.reward_failure_example[:197] + "..."
    return f"reward failures {m.reward_failures}/{m.num_samples}: {example}"


_CONSOLE = ("reward_mean", "accuracy", "kl", "entropy", "clip_fraction", "response_len_mean", "drift",
            "generated_tokens_per_s", "step_s", "orchestration_overhead")


class RLTracker(Tracker):
    """Console + wandb sink for StepMetrics (the controller is one process: it always reports). `wandb_run`
    (posttrain.tracking.wandb_run) is started here, continuing `wandb_id` after a resume, and finished by `close` with
    the final model's id."""

    postfix_width = 160

    def __init__(self, cfg: TrackingConfig, *, name: str, total: int, start: int = 0,
                 wandb_run: WandbRun | None = None, wandb_id: str | None = None):
        super().__init__(cfg, 0, name, total=total, start=start, wandb_run=wandb_run, wandb_id=wandb_id)

    def log(self, m: StepMetrics) -> None:
        flat = m.flat()
        self._emit(m.step, flat, wandb_step=m.step, line=" ".join(f"{k}={flat[k]:.4g}" for k in _CONSOLE),
                   label=f"rl step {m.step}/{self.total}", note=failure_line(m))

    def close(self, model_id: str | None = None, *, failed: bool = False) -> None:
        """End the run, recording the final model's id when there is one."""
        super().close()
        if self._run is not None:
            self._run.finish(outputs={"model": model_id} if model_id else None, failed=failed)
