"""Shared fixtures.

Tests that start Ray are marked `ray` and run in their own pytest process (see the Makefile): forking
ranks (torch.distributed, Elastic) in a process that holds Ray's threads can deadlock.
"""

from __future__ import annotations

import os

import pytest

# Never let a test talk to a hub or write wandb runs into the repository.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster for the session, with more logical CPUs than cores so that every role's
    actor fits (fractional CPUs are a scheduling budget, not a thread count)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
