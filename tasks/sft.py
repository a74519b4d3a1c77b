"""The dense objectives as SPMD tasks - SFT, DPO, reward model, distillation: flytekitplugins-kfpytorch `Elastic`
starts N processes that run the same step (posttrain.sft; one trainer, the config section picks the objective).

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

from flytekit import Deck, Resources, task
from flytekitplugins.kfpytorch import Elastic

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import DistillConfig, DPOConfig, ModelConfig, RewardModelConfig, SFTConfig, TrackingConfig
from tasks import settings
from tasks.errors import stage_errors

SPMD = {
    "container_image": cpu_image,
    "task_config": Elastic(nnodes=settings.SFT_NNODES, nproc_per_node=settings.SFT_NPROC, start_method="fork",
                           monitor_interval=1, increase_shared_mem=False, max_restarts=settings.SFT_MAX_RESTARTS),
    "requests": Resources(cpu="2", mem="8Gi"),
    "retries": settings.TASK_RETRIES,
    "enable_deck": True,
}
"""Every dense objective's task: the same Elastic group, resources, retries and Deck."""


def _train(stage: str, model: ModelConfig, cfg: SFTConfig, tracking: TrackingConfig, dataset: ArtifactRef,
           tokenizer: ArtifactRef | None, run_id: str, start_model: ArtifactRef | None) -> ArtifactRef | None:
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    with stage_errors(stage):
        ref = stages.train(model, cfg, tracking, dataset=dataset, tokenizer=tokenizer, start=start_model,
                           run_id=run_id)
    if ref is not None:  # rank 0
        Deck(stage, render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref


@task(**SPMD)
def dpo(model: ModelConfig, dpo: DPOConfig, tracking: TrackingConfig, pairs: ArtifactRef, run_id: str,
        start_model: ArtifactRef) -> ArtifactRef:
    """DPO from `start_model` on the preference `pairs`; the reference is dpo.reference or the start model."""
    return _train("dpo", model, dpo, tracking, pairs, None, run_id, start_model)


@task(**SPMD)
def reward_model(model: ModelConfig, reward_model: RewardModelConfig, tracking: TrackingConfig, pairs: ArtifactRef,
                 run_id: str, start_model: ArtifactRef) -> ArtifactRef:
    """A Bradley-Terry reward model on `start_model`'s body, trained on the preference `pairs`."""
    return _train("reward_model", model, reward_model, tracking, pairs, None, run_id, start_model)


@task(**SPMD)
def distill(model: ModelConfig, distill: DistillConfig, tracking: TrackingConfig, dataset: ArtifactRef, run_id: str,
            start_model: ArtifactRef | None = None) -> ArtifactRef:
    """The student (`start_model`, or a fresh model of `model` with the teacher's tokenizer) distilled from
    distill.teacher on the dataset's demonstrations."""
    return _train("distill", model, distill, tracking, dataset, None, run_id, start_model)


@task(**SPMD)
def sft(model: ModelConfig, sft: SFTConfig, tracking: TrackingConfig, dataset: ArtifactRef,
        tokenizer: ArtifactRef | None, run_id: str, start_model: ArtifactRef | None = None) -> ArtifactRef:
    """`start_model`: the model to fine-tune (tasks/model.py); left out, it is resolved from `model` here.
    Deck: the model's training curves (rank 0 makes it; Elastic hands rank 0's Decks to the task)."""
    return _train("sft", model, sft, tracking, dataset, tokenizer, run_id, start_model)
