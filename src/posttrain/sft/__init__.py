"""The SPMD SFT trainer (see trainer.py)."""

from posttrain.sft.trainer import run_sft

__all__ = ["run_sft"]
