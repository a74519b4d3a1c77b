"""The eval gate: promote a model to a channel only when its evaluation clears the bar."""

from __future__ import annotations

from dataclasses import dataclass

from flytekit import task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef


@dataclass(frozen=True, kw_only=True)
class Promotion:
    channel: str
    promoted: bool
    model_id: str
    reason: str


@task(container_image=cpu_image)
def promote(channel: str, model: ArtifactRef, eval_report: ArtifactRef, min_accuracy: float) -> Promotion:
    from posttrain.promotion import gate

    d = gate(channel=channel, model=model, eval_report=eval_report, min_accuracy=min_accuracy)
    return Promotion(channel=channel, promoted=d.promoted, model_id=model.id, reason=d.reason)
