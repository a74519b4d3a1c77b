"""Data prep task: local files or a built-in verifiable task -> `dataset` (+ `tokenizer`) artifacts."""

from __future__ import annotations

from typing import NamedTuple, Optional

from flytekit import Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import DataConfig

DataOut = NamedTuple("DataOut", [("dataset", ArtifactRef), ("tokenizer", Optional[ArtifactRef])])


@task(container_image=cpu_image, requests=Resources(cpu="2", mem="4Gi"))
def data_prep(cfg: DataConfig, run_id: str) -> DataOut:
    from posttrain import stages

    out = stages.data_prep(cfg, run_id=run_id)
    return DataOut(out.dataset, out.tokenizer)
