"""Step metrics to the console (a tqdm bar when interactive, otherwise lines paced by posttrain.progress with
rate and ETA) and to the stage's wandb run (posttrain.wandb_run), if it has one.

Only rank 0 reports. The wandb run is started here (continuing `wandb_id` after a restart) but finished by the
stage that owns it, once the output artifact is stored.
"""

from __future__ import annotations

import sys

from posttrain.config import TrackingConfig
from posttrain.progress import Progress
from posttrain.wandb_run import WandbRun


class Tracker:
    def __init__(self, cfg: TrackingConfig, rank: int, name: str, *, total: int, start: int = 0,
                 wandb_run: WandbRun | None = None, wandb_id: str | None = None):
        self.cfg, self.active = cfg, rank == 0
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
        if not self.active:
            return
        if self._run is not None:
            self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        line = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
                        if isinstance(v, (int, float)))
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(line[:120])
        elif self.progress.due(step + 1):  # `step` counts from 0: step + 1 are done
            print(f"step {step}: {line} | {self.progress.stats(step + 1)}", flush=True)

    def close(self) -> None:
        """Close the progress bar (the wandb run stays open for its owner to finish)."""
        if self._bar is not None:
            self._bar.close()
