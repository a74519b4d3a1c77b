"""Prompt selection by pass rate before RL (`data.pass_rate`; posttrain.eval.pass_rate): the start model samples
k answers per train prompt; the prompts it solves in some but not all of them are a new `dataset` artifact
(parents: the model and the dataset) that RL trains on."""

from __future__ import annotations

from flytekit import Deck, Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import DataConfig, RewardConfig, RLConfig
from tasks.errors import stage_errors


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"), enable_deck=True)
def select_prompts(data: DataConfig, rl: RLConfig, reward: RewardConfig, model: ArtifactRef, dataset: ArtifactRef,
                   run_id: str) -> ArtifactRef:
    """Deck: the selected dataset's page."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("pass_rate"):
        ref = stages.select_prompts(data, rl, reward, model=model, dataset=dataset, run_id=run_id)
    Deck("pass_rate", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref


@task(container_image=cpu_image)
def all_prompts(dataset: ArtifactRef) -> ArtifactRef:
    """Every train prompt (data.pass_rate.enabled false): the dataset as data prep made it."""
    return dataset
