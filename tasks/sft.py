"""SFT as an SPMD task: flytekitplugins-kfpytorch `Elastic` starts N processes that run the same step.

Locally (`pyflyte run` without --remote) `nnodes=1, nproc_per_node=N` forks N real processes with a gloo
process group; on a cluster nnodes=1 is a plain pod and nnodes>1 a PyTorchJob of the training operator.
N is fixed when the task is defined (tasks/settings.py: POSTTRAIN_SFT_NPROC, default 2) and must equal
`sft.nproc` (checked by `plan` and again by the trainer against WORLD_SIZE). `start_method="fork"`: spawn
cannot import a workflow module that is not installed (measured: ModuleNotFoundError under
`pyflyte run`), and fork starts ranks faster. A rank that dies is restarted with all the others by torch
elastic (`max_restarts`, tasks/settings.py) and they resume from the newest SFT state; a lost pod is
retried by Flyte (`retries`).
"""

from __future__ import annotations

from typing import Optional

from flytekit import Deck, Resources, task
from flytekitplugins.kfpytorch import Elastic

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import ModelConfig, SFTConfig, TrackingConfig
from tasks import settings
from tasks.errors import stage_errors


@task(
    container_image=cpu_image,
    task_config=Elastic(nnodes=settings.SFT_NNODES, nproc_per_node=settings.SFT_NPROC, start_method="fork",
                        monitor_interval=1, increase_shared_mem=False, max_restarts=settings.SFT_MAX_RESTARTS),
    requests=Resources(cpu="2", mem="8Gi"),
    retries=settings.TASK_RETRIES,
    enable_deck=True,
)
def sft(model: ModelConfig, sft: SFTConfig, tracking: TrackingConfig, dataset: ArtifactRef,
        tokenizer: Optional[ArtifactRef], run_id: str, start_model: Optional[ArtifactRef] = None) -> ArtifactRef:
    """`start_model`: the model to fine-tune (tasks/model.py); left out, it is resolved from `model` here.
    Deck: the model's training curves (rank 0 makes it; Elastic hands rank 0's Decks to the task)."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors("sft"):
        ref = stages.sft(model, sft, tracking, dataset=dataset, tokenizer=tokenizer, start=start_model, run_id=run_id)
    if ref is not None:  # rank 0
        Deck("sft", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref
