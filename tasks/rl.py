"""RL as a Ray-plugin task: the body starts ONE controller actor on the Ray cluster and waits for it.

flytekitplugins-ray's `pre_execute` connects to Ray (`ray.init`): in local execution a single-node Ray in
this process (worker groups ignored, actors sized to the node's CPUs by posttrain.rl.placement); on a
cluster a KubeRay RayJob with a head and two worker groups named after roles - `rollout` (generation) and
`train` (the SPMD policy group; reference and reward share it). Their replica counts are fixed when the task
is defined (tasks/settings.py) and `plan` checks them against `placement.*_workers`. Each group's nodes
advertise a custom resource named after the group, which posttrain.rl.placement's bundles ask a sliver of,
so every role's actors land on their group's pods.

Failures: inside the task, a lost worker or a timeout rebuilds the actors up to `rl.max_restarts` times
(posttrain.rl.run); beyond that the error is raised as a FlyteRecoverableException, so Flyte's `retries`
(tasks/settings.py) run the task again, which resumes from the RL state it can reach. Any other error (bad
settings, stale weights, drift, non-finite numbers, a failing reward) is not retried: it would recur.
"""

from __future__ import annotations

from flytekit import Deck, PodTemplate, Resources, task
from flytekit.core.resources import pod_spec_from_resources
from flytekitplugins.ray import HeadNodeConfig, RayJobConfig, WorkerNodeConfig

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import ModelConfig, PlacementConfig, RewardConfig, RLConfig, TrackingConfig
from posttrain.rl.placement import group_resource_start_params
from tasks import settings
from tasks.errors import stage_errors


def ray_pod(container: str, requests: Resources, shm: str) -> PodTemplate:
    """A Ray pod with `requests` (= limits) and a memory-backed /dev/shm of `shm` (Kubernetes quantity), which the
    policy's weight file goes to (posttrain.rl.weight_transfer; a container's default /dev/shm is 64 MiB). The
    volume's pages count against the pod's memory limit. flytekitplugins-ray takes requests or a pod template,
    not both: hence the template. `container` is the plugin's name for the Ray container (ray-head/ray-worker)."""
    from kubernetes.client import V1EmptyDirVolumeSource, V1Volume, V1VolumeMount

    spec = pod_spec_from_resources(primary_container_name=container, requests=requests, limits=requests)
    spec.volumes = [V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory", size_limit=shm))]
    spec.containers[0].volume_mounts = [V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    return PodTemplate(pod_spec=spec, primary_container_name=container)


ray_config = RayJobConfig(
    head_node_config=HeadNodeConfig(ray_start_params={"num-cpus": "1"},
                                    pod_template=ray_pod("ray-head", Resources(cpu="1", mem="2Gi"), "256Mi")),
    worker_node_config=[  # no `rollout` group when the policy ranks generate (placement.rollout_workers 0)
        *([WorkerNodeConfig(group_name="rollout", replicas=settings.RAY_ROLLOUT_REPLICAS,
                            ray_start_params=group_resource_start_params("rollout"),
                            pod_template=ray_pod("ray-worker", Resources(cpu="2", mem="4Gi"), settings.RAY_SHM))]
          if settings.RAY_ROLLOUT_REPLICAS > 0 else []),
        WorkerNodeConfig(group_name="train", replicas=settings.RAY_TRAIN_REPLICAS,
                         ray_start_params=group_resource_start_params("train"),
                         pod_template=ray_pod("ray-worker", Resources(cpu="2", mem="4Gi"), settings.RAY_SHM)),
    ],
    shutdown_after_job_finishes=True,
    ttl_seconds_after_finished=600,
)


@task(container_image=cpu_image, task_config=ray_config, requests=Resources(cpu="1", mem="2Gi"),
      retries=settings.TASK_RETRIES, enable_deck=True)
def rl(rl: RLConfig, reward: RewardConfig, placement: PlacementConfig, model: ModelConfig, tracking: TrackingConfig,
       start_model: ArtifactRef, dataset: ArtifactRef, run_id: str,
       reward_model: ArtifactRef | None = None) -> ArtifactRef:
    """Deck: the final model's page (per-step curves and phase times), or the start model's when RL is off.
    `reward_model`: a reward model the workflow trained (rlhf_pipeline); it scores beside `reward.models`."""
    from flytekit.exceptions.user import FlyteRecoverableException

    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page
    from posttrain.rl.run import RESTARTABLE

    try:
        with stage_errors("rl"):
            ref = stages.rl(rl, reward, placement, tracking, max_seq_len=model.max_seq_len, model_cfg=model,
                            start_model=start_model, dataset=dataset, run_id=run_id, reward_model=reward_model)
    except RESTARTABLE as e:  # lost workers or timeouts beyond rl.max_restarts: let Flyte retry the task
        raise FlyteRecoverableException(f"{type(e).__name__}: {e}") from e
    Deck("rl", render_page(ArtifactStore(ref.store), ref.id, standalone=False))
    return ref
