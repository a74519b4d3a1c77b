"""Every role's constructor arguments are given by name and bind to its worker class's `__init__`: a renamed or
reordered parameter fails here, not in a Ray actor at start-up."""

from __future__ import annotations

import inspect

import pytest

from posttrain.config import ModelConfig, PlacementConfig, RewardConfig, RLConfig
from posttrain.rl.roles import registry


@pytest.mark.parametrize("role", sorted(registry.ROLES))
def test_each_roles_keyword_arguments_bind_to_its_worker(role):
    spec = registry.ROLES[role]
    settings = registry.RunSettings(rl=RLConfig(teacher="/models/teacher", critic_init="/models/rm"),
                                    reward=RewardConfig(models=["/models/rm"]), placement=PlacementConfig(),
                                    model=ModelConfig(), start_model_dir="/models/start")
    kwargs = spec.worker_kwargs(settings, 1, 2)
    bound = inspect.signature(spec.worker()).bind(**kwargs)  # raises on a missing or unknown name
    assert bound.arguments["rank"] == 1 and bound.arguments["world_size"] == 2
