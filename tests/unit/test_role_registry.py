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


ENVIRONMENT_ROLE_FILES = {"rl/roles/environment.py", "rl/roles/episode_rollout.py"}
"""The environment role's own files under rl/ (its package posttrain.envs is outside the RL core)."""
PROCESS_ENV_NAMES = {"env", "env_vars", "runtime_env", "worker_env_vars", "environ"}
"""Names about a process's environment variables, not the environment role."""


def _names(path) -> set[str]:
    """Every identifier, keyword, imported name and short string constant in one source file."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.alias):
            out.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
            out.add(node.value)
    return out


def test_the_environment_role_is_its_own_files_plus_the_registry_row():
    """Adding a role costs its own files plus three shared ones: its registry row, its settings
    (config/rl_sections.py) and their checks (config/rl_checks.py). The environment role is the test: no other
    file of the RL run (rl/, stages/rl.py) names it, its episodes or its tools - what it hands on travels in
    Trajectories' generic fields and the registry's hooks (compose, preflight, code, lineage)."""
    import re
    from pathlib import Path

    import posttrain

    root = Path(posttrain.__file__).parent
    named = re.compile(r"environment|episode|tool|(^|_)env(_|$)", re.IGNORECASE)
    shared = [p for p in [*root.glob("rl/**/*.py"), root / "stages/rl.py"]
              if str(p.relative_to(root)) not in ENVIRONMENT_ROLE_FILES | {"rl/roles/registry.py"}]
    found = {str(p.relative_to(root)): sorted(n for n in _names(p) - PROCESS_ENV_NAMES if named.search(n))
             for p in shared}
    found = {f: names for f, names in found.items() if names}
    assert found == {"rl/state.py": ["episodes"]}, found  # the manifest key the RL page reads (artifact layout)
    spec = registry.ROLES["environment"]
    assert spec.compose and spec.preflight and spec.lineage and spec.code == ("envs",) and spec.scores


def test_preflight_builds_the_start_models_folder_only_for_a_role_that_checks_something():
    """A run without the environment role (or its cache hit) never merges a LoRA start model to compute its key."""
    def no_folder() -> str:
        raise AssertionError("the start model's folder was built for a run whose roles check nothing")

    plain = registry.RunSettings(rl=RLConfig(), reward=RewardConfig(), placement=PlacementConfig(), model=None,
                                 start_model_dir="")
    assert registry.preflight(plain, no_folder) == ([], ())
    with_env = registry.RunSettings(rl=RLConfig(environment="posttrain.envs.builtin:Calculator"),
                                    reward=RewardConfig(), placement=PlacementConfig(), model=None, start_model_dir="")
    with pytest.raises(AssertionError, match="folder was built"):
        registry.preflight(with_env, no_folder)
