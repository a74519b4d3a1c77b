"""Step metrics to the console (a tqdm bar when interactive, otherwise lines paced by posttrain.progress with
rate and ETA) and to wandb.

Only rank 0 reports. wandb runs in `tracking.wandb_mode` ("offline" by default, files under the state
folder; "disabled" creates nothing) and resumes the same run id after a restart.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from posttrain.config import TrackingConfig, to_dict
from posttrain.progress import Progress


class Tracker:
    def __init__(self, cfg: TrackingConfig, rank: int, name: str, state_dir: Path, *, total: int, start: int = 0,
                 wandb_id: str | None = None, config: dict | None = None):
        self.cfg, self.active = cfg, rank == 0
        self.wandb_id, self._run, self._bar = wandb_id, None, None
        self.progress = Progress(total, every_s=cfg.progress_every_s, log_every=cfg.log_every)
        if not self.active:
            return
        if sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=name, dynamic_ncols=True)
        if cfg.wandb_mode != "disabled":
            import wandb

            cfg_dict = {k: to_dict(v) if dataclasses.is_dataclass(v) else v for k, v in (config or {}).items()}
            self._run = wandb.init(project=cfg.wandb_project, name=name, mode=cfg.wandb_mode, dir=str(state_dir),
                                   id=wandb_id, resume="allow", config=cfg_dict, settings=wandb.Settings(
                                       silent=True, console="off", x_disable_stats=True))
            self.wandb_id = self._run.id

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
        if self._bar is not None:
            self._bar.close()
        if self._run is not None:
            self._run.finish()
