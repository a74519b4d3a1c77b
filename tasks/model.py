"""The model a run starts from: a local HF folder (`model.base_path`) or a stored `model` artifact
(`model.artifact`) resolved into an `ArtifactRef`, so every later task (SFT, RL, evaluation) reads verified
weights from the store and lineage reaches the start model. A folder is stored once, by content: the same
files always give the same id, and a second run copies nothing.
"""

from __future__ import annotations

from flytekit import Deck, Resources, task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import ModelConfig
from tasks.errors import stage_errors


@task(container_image=cpu_image, requests=Resources(cpu="1", mem="2Gi"), enable_deck=True)
def start_model(model: ModelConfig, run_id: str) -> ArtifactRef | None:
    """`model.artifact` or the stored `model.base_path` folder; None for a from-scratch model. Deck: the
    model's page (its own training curves when it came out of an earlier SFT or RL run)."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("start_model"):
        ref = stages.start_model(model, run_id=run_id)
    if ref is not None:
        Deck("model", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref


@task(container_image=cpu_image)
def given_model(start: ArtifactRef | None) -> ArtifactRef:
    """The start model, where a workflow needs one (evaluation alone, or RL with sft.enabled=false)."""
    if start is None:
        from posttrain.config import ConfigError

        raise ConfigError("no model given: set model.base_path (a local HF folder) or model.artifact (an artifact "
                         "id), e.g. --overrides '{\"model\": {\"base_path\": \"/models/my-model\"}}'")
    return start
