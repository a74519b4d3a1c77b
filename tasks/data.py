"""Data prep task: local files or a built-in verifiable task -> `dataset` (+ `tokenizer`) artifacts."""

from __future__ import annotations

from typing import NamedTuple, Optional

from flytekit import Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import DataConfig

DataOut = NamedTuple("DataOut", [("dataset", ArtifactRef), ("tokenizer", Optional[ArtifactRef])])


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"))
def data_prep(cfg: DataConfig, require_completions: bool, run_id: str) -> DataOut:
    """`require_completions` (the workflows pass `sft.enabled`): every train row must end with an assistant
    turn, because SFT will train on it."""
    from posttrain import stages

    out = stages.data_prep(cfg, require_completions=require_completions, run_id=run_id)
    return DataOut(out.dataset, out.tokenizer)
