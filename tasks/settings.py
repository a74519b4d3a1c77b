"""Settings that flytekit fixes when a task is DEFINED (at import), not when it runs.

Elastic's process count and the Ray worker groups are part of the task's definition: on a cluster they
decide how many pods/processes start. They are read from the environment at import time, so a user changes
them with e.g. `POSTTRAIN_SFT_NPROC=4 pyflyte run ...` (or `pyflyte register` for a cluster), and the
`plan` task checks that the runtime config agrees (`sft.nproc`, `placement.*_workers`), failing before any
work starts if it does not.
"""

from __future__ import annotations

import os

SFT_NNODES = int(os.environ.get("POSTTRAIN_SFT_NNODES", "1"))
"""Elastic nnodes: 1 runs N local processes (a plain pod on a cluster); >1 needs the training operator."""
SFT_NPROC = int(os.environ.get("POSTTRAIN_SFT_NPROC", "2"))
"""Elastic nproc_per_node: must equal the config's `sft.nproc`."""
RAY_TRAIN_REPLICAS = int(os.environ.get("POSTTRAIN_RAY_TRAIN_REPLICAS", "2"))
"""Replicas of the Ray `train` worker group (one per policy rank): must equal `placement.policy_workers`."""
RAY_ROLLOUT_REPLICAS = int(os.environ.get("POSTTRAIN_RAY_ROLLOUT_REPLICAS", "1"))
"""Replicas of the Ray `rollout` worker group: must equal `placement.rollout_workers`."""
RAY_SHM = os.environ.get("POSTTRAIN_RAY_SHM", "1Gi")
"""Size of the memory-backed /dev/shm on every Ray worker pod (a Kubernetes quantity): room for the policy's
weight file during a sync (model parameters x 4 bytes in fp32, x 2 in bf16: 538 MB for a 135M model). Without
room, the weights go through a disk file or Ray's object store instead (named in the run's log)."""
TASK_RETRIES = int(os.environ.get("POSTTRAIN_TASK_RETRIES", "2"))
"""Flyte `retries` of the SFT and RL tasks. Flyte retries a task on a system failure (a lost pod or node) and
on a FlyteRecoverableException; the retry resumes from the stage's resumable state where it can reach it."""
SFT_MAX_RESTARTS = int(os.environ.get("POSTTRAIN_SFT_MAX_RESTARTS", "2"))
"""Elastic `max_restarts`: times torch elastic restarts the SFT ranks when one dies (e.g. killed), inside the
task; the new ranks resume from the newest saved SFT state (sft.save_every)."""


def check_against(sft_nproc: int, policy_workers: int, rollout_workers: int, *, local: bool = False) -> None:
    """Raise a ConfigError naming the field when the runtime config disagrees with the task definitions.

    `local` (Flyte local execution): Elastic really starts `nproc_per_node` processes, so sft.nproc is checked;
    the Ray worker groups are not - local execution runs one local Ray and ignores them (any
    placement.*_workers fit it, and the placement plan sizes actors to its CPUs)."""
    from posttrain.config import ConfigError

    if sft_nproc != SFT_NPROC:
        raise ConfigError(f"sft.nproc: is {sft_nproc} but the SFT task was defined with nproc_per_node="
                          f"{SFT_NPROC}; set POSTTRAIN_SFT_NPROC={sft_nproc} (or change sft.nproc)")
    if local:
        return
    if policy_workers != RAY_TRAIN_REPLICAS:
        raise ConfigError(f"placement.policy_workers: is {policy_workers} but the RL task's `train` worker group "
                          f"has {RAY_TRAIN_REPLICAS} replicas; set POSTTRAIN_RAY_TRAIN_REPLICAS={policy_workers}")
    if rollout_workers != RAY_ROLLOUT_REPLICAS:
        raise ConfigError(f"placement.rollout_workers: is {rollout_workers} but the RL task's `rollout` worker "
                          f"group has {RAY_ROLLOUT_REPLICAS} replicas; set "
                          f"POSTTRAIN_RAY_ROLLOUT_REPLICAS={rollout_workers}")
