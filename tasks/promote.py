"""The eval gate of scheduled retraining: the candidate and the channel's current holder, evaluated on the
channel's pinned eval set with the run's eval settings, then promoted or refused (posttrain.stages.gate)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from flytekit import Deck, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import EvalConfig, RewardConfig
from tasks.errors import stage_errors


@dataclass(frozen=True, kw_only=True)
class Promotion:
    channel: str
    promoted: bool
    """False: refused - `reason` says why; the workflow still succeeds (a refusal is a decision, not an error)."""
    model_id: str
    reason: str
    decision_id: str
    """The `decision` artifact: inputs, both evaluations, thresholds (`posttrain lineage DECISION_ID`)."""


@task(container_image=cpu_image)
def retrain_run_id(kickoff_time: datetime.datetime | None) -> str:
    """The run id of a retrain: `nightly-<kickoff time, UTC>` when a schedule started it (every artifact
    of the run records it), else a fresh id."""
    from posttrain.artifacts.run_ids import new_run_id

    if kickoff_time is None:
        return new_run_id()
    t = kickoff_time.astimezone(datetime.UTC) if kickoff_time.tzinfo else kickoff_time
    return f"nightly-{t:%Y%m%dT%H%M%SZ}"


@task(container_image=cpu_image, enable_deck=True)
def promote(channel: str, model: ArtifactRef, dataset: ArtifactRef, eval: EvalConfig, reward: RewardConfig,
            min_accuracy: float, tolerance: float, run_id: str, require_gain: bool = False) -> Promotion:
    """`dataset` (the run's) becomes the channel's pinned eval set only at its first decision. Deck: the
    decision - verdict, reason, both models' accuracies per set against the bar."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page
    from posttrain.stages.gate import judge

    store = ArtifactStore()
    with stage_errors("promote"):
        d = judge(channel=channel, model=model, pin_to=dataset, eval_cfg=eval, reward=reward,
                  min_accuracy=min_accuracy, tolerance=tolerance, run_id=run_id, store=store,
                  require_gain=require_gain)
    Deck("promotion", render_page(store, d.decision_id, standalone=False))
    return Promotion(channel=channel, promoted=d.promoted, model_id=model.id, reason=d.reason,
                     decision_id=d.decision_id)
