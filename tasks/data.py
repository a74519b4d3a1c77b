"""Data prep task: local files or a built-in verifiable task -> `dataset` (+ `tokenizer`) artifacts."""

from __future__ import annotations

from typing import NamedTuple

from flytekit import Deck, Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import DataConfig
from tasks.errors import stage_errors


class DataOut(NamedTuple):
    dataset: ArtifactRef
    tokenizer: ArtifactRef | None


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"), enable_deck=True)
def data_prep(cfg: DataConfig, require_completions: bool, run_id: str) -> DataOut:
    """`require_completions` (the workflows pass `sft.enabled`): every train row must end with an assistant
    turn, because SFT will train on it. Deck: the dataset's page (posttrain.report)."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("data_prep"):
        out = stages.data_prep(cfg, require_completions=require_completions, run_id=run_id)
    Deck("dataset", render_page(ArtifactStore(out.dataset.store), out.dataset.id, standalone=False))
    return DataOut(out.dataset, out.tokenizer)
