"""Evaluation task: greedy accuracy (always), sampled accuracy and pass@k (only when eval.k > 0, else None) on
the held-out split, scored through the same reward sandbox as RL -> `eval` artifact."""

from __future__ import annotations

from typing import NamedTuple

from flytekit import Deck, Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import EvalConfig, RewardConfig, TrackingConfig
from tasks.errors import stage_errors


class EvalOut(NamedTuple):
    report: ArtifactRef
    greedy_accuracy: float
    sampled_accuracy: float | None
    pass_at_k: float | None
    reward_failures: int


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"), enable_deck=True)
def evaluate(cfg: EvalConfig, reward: RewardConfig, tracking: TrackingConfig, model: ArtifactRef, dataset: ArtifactRef,
             run_id: str) -> EvalOut:
    """Deck: the eval's page (intervals, samples, and the start model's eval beside it when there is one).
    A new evaluation is also a wandb run (tracking.wandb) with a per-problem table."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("evaluate"):
        out = stages.evaluate(cfg, reward, model=model, dataset=dataset, run_id=run_id, tracking=tracking)
    Deck("eval", render_page(ArtifactStore(out.report.store), out.report.id, standalone=False))
    return EvalOut(out.report, out.greedy_accuracy, out.sampled_accuracy, out.pass_at_k, out.reward_failures)


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"), enable_deck=True)
def evaluate_reward_model(reward_model: ArtifactRef, pairs: ArtifactRef, run_id: str) -> ArtifactRef:
    """Pairwise accuracy and score distributions of the reward model on the held-out pairs -> `eval` artifact."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("evaluate_reward_model"):
        ref = stages.evaluate_reward_model(reward_model=reward_model, pairs=pairs, run_id=run_id)
    Deck("eval", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref
