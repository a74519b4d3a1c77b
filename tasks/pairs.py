"""Preference pairs from a model's own samples (posttrain.eval.pairs): k completions per prompt, scored by the reward
function, one correct and one wrong kept per prompt -> a preference `dataset` artifact (parents: model, prompts)."""

from __future__ import annotations

from flytekit import Deck, Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import PairsConfig, RewardConfig
from tasks.errors import stage_errors


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"), enable_deck=True)
def make_pairs(cfg: PairsConfig, reward: RewardConfig, model: ArtifactRef, dataset: ArtifactRef,
               run_id: str) -> ArtifactRef:
    """Deck: the pairs dataset's page."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("pairs"):
        ref = stages.pairs(cfg, reward, model=model, dataset=dataset, run_id=run_id)
    Deck("pairs", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref


@task(container_image=cpu_image)
def given_pairs(dataset: ArtifactRef) -> ArtifactRef:
    """The user's own preference data (data.schema 'preference'), where a workflow would otherwise sample pairs."""
    return dataset
