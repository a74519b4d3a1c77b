"""What a stage reports while it runs: the one step tracker (tracker.py) that prints progress (progress.py) and
logs to the stage's wandb run (wandb_run.py)."""

from posttrain.tracking.tracker import Tracker

__all__ = ["Tracker"]
