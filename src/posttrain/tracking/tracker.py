"""Step metrics to the console (a tqdm bar when interactive, otherwise lines paced by posttrain.tracking.progress with
rate and ETA) and to the stage's wandb run (posttrain.tracking.wandb_run), if it has one: the one tracker of every stage.

`Tracker.log(step, metrics)` is the SFT trainer's (a dict per 0-based step); the RL controller's
`posttrain.rl.metrics.RLTracker` is a subclass that logs `StepMetrics`, adds its reward-failure lines and
finishes the wandb run at `close`.

Only rank 0 reports. The wandb run is started here (continuing `wandb_id` after a restart) but finished by the
stage that owns it, once the output artifact is stored.
"""

from __future__ import annotations

import sys

from posttrain.config import TrackingConfig
from posttrain.tracking.progress import Progress
from posttrain.tracking.wandb_run import WandbRun


class Tracker:
    postfix_width = 120
    """How much of the console line the tqdm bar shows."""

    def __init__(self, cfg: TrackingConfig, rank: int, name: str, *, total: int, start: int = 0,
                 wandb_run: WandbRun | None = None, wandb_id: str | None = None):
        self.cfg, self.total, self.active = cfg, total, rank == 0
        self.wandb_id, self._run, self._bar = wandb_id, None, None
        self.progress = Progress(total, every_s=cfg.progress_every_s, log_every=cfg.log_every)
        if not self.active:
            return
        if sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=name, dynamic_ncols=True)
        if wandb_run is not None:
            self.wandb_id = wandb_run.start(resume_id=wandb_id)
            self._run = wandb_run

    def log(self, step: int, metrics: dict) -> None:
        """`step` counts from 0; the numbers among `metrics` go to wandb and the console."""
        if not self.active:
            return
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        line = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())
        self._emit(step + 1, numbers, wandb_step=step, line=line, label=f"step {step}")  # step + 1 are done

    def _emit(self, done: int, metrics: dict, *, wandb_step: int, line: str, label: str, note: str = "") -> None:
        """One step: `metrics` to wandb at `wandb_step`; `line` on the bar, or printed as "`label`: `line`" when
        posttrain.tracking.progress says it is due after `done` steps. A `note` ("" for none) is printed whatever the
        pace (above the bar, or at the end of the line)."""
        if not self.active:
            return
        if self._run is not None:
            self._run.log(metrics, step=wandb_step)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(line[:self.postfix_width])
            if note:
                self._bar.write(f"{label}: {note}")
        elif note or self.progress.due(done):
            print(f"{label}: {line}" + (f" | {note}" if note else "") + f" | {self.progress.stats(done)}", flush=True)

    def close(self) -> None:
        """Close the progress bar (the wandb run stays open for its owner to finish)."""
        if self._bar is not None:
            self._bar.close()
