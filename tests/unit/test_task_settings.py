"""The plan's check of the runtime config against settings fixed when tasks are defined (tasks/settings.py)."""

from __future__ import annotations

import pytest

from posttrain.config import ConfigError
from tasks import settings


def test_ray_worker_groups_are_checked_on_a_cluster_but_not_in_local_execution():
    n, train = settings.SFT_NPROC, settings.RAY_TRAIN_REPLICAS
    settings.check_against(n, train + 1, 5, local=True)  # one local Ray: worker groups are ignored there
    with pytest.raises(ConfigError, match="placement.policy_workers.*POSTTRAIN_RAY_TRAIN_REPLICAS"):
        settings.check_against(n, train + 1, settings.RAY_ROLLOUT_REPLICAS, local=False)
    with pytest.raises(ConfigError, match="placement.rollout_workers"):
        settings.check_against(n, train, settings.RAY_ROLLOUT_REPLICAS + 1, local=False)
    with pytest.raises(ConfigError, match="sft.nproc.*POSTTRAIN_SFT_NPROC"):  # Elastic starts them locally too
        settings.check_against(n + 1, train, settings.RAY_ROLLOUT_REPLICAS, local=True)


def test_every_image_spec_is_some_tasks_image():
    """images/specs.py defines only images that tasks run in: an ImageSpec no task names does nothing."""
    import importlib
    import pkgutil

    from flytekit import ImageSpec
    from flytekit.core.base_task import PythonTask

    import images.specs
    import tasks

    defined = {name for name, v in vars(images.specs).items() if isinstance(v, ImageSpec)}
    used = set()
    for mod in pkgutil.iter_modules(tasks.__path__):
        for v in vars(importlib.import_module(f"tasks.{mod.name}")).values():
            if isinstance(v, PythonTask):
                used |= {name for name in defined if v.container_image is getattr(images.specs, name)}
    assert defined and defined <= used, f"ImageSpecs no task uses: {sorted(defined - used)}"


def test_sft_and_rl_tasks_are_retried_and_sft_ranks_restarted():
    """Flyte retries the two long tasks (a lost pod, a FlyteRecoverableException), and torch elastic restarts
    dead SFT ranks inside the task; a task without them ends the pipeline on the first lost worker."""
    from tasks.rl import rl
    from tasks.sft import sft

    assert settings.TASK_RETRIES >= 1
    assert rl.metadata.retries == sft.metadata.retries == settings.TASK_RETRIES
    assert sft.task_config.max_restarts == settings.SFT_MAX_RESTARTS >= 1


def test_rl_errors_past_its_restarts_are_recoverable_for_flyte_and_others_are_not():
    from posttrain.rl.remote import RemoteTimeoutError, RemoteWorkerError, WorkerLostError
    from posttrain.rl.run import RESTARTABLE, StepTimeoutError
    from posttrain.rl.weight_sync import StaleWeightsError

    for e in (WorkerLostError("x"), RemoteTimeoutError("x"), StepTimeoutError("x")):
        assert isinstance(e, RESTARTABLE)
    for e in (RemoteWorkerError("x"), StaleWeightsError("x"), ConfigError("x"), ValueError("x")):
        assert not isinstance(e, RESTARTABLE)
