"""Held-out evaluation (see evaluate.py)."""

from posttrain.eval.evaluate import evaluate
from posttrain.eval.report import EvalReport

__all__ = ["EvalReport", "evaluate"]
