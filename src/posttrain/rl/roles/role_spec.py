"""What a role's declaration is made of (the rows of registry.ROLES): the settings a row reads (`RunSettings`), what
building its group needs (`GroupContext`), the settings through which it loads models (`ModelSetting`) and the
row itself (`RoleSpec`). Adding a role adds a row to the registry, not a field here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.config import ModelConfig, PlacementConfig, RewardConfig, RLConfig


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What a role's declaration reads: the run's settings and its start model."""

    rl: RLConfig
    reward: RewardConfig
    placement: PlacementConfig
    model: ModelConfig | None
    start_model_dir: str


@dataclass(frozen=True, kw_only=True)
class GroupContext:
    """What building a group needs beyond its own workers: the other roles' identities (e.g. whether every
    rollout worker shares policy rank 0's node) and the run's transport folder."""

    settings: RunSettings
    ids: dict[str, list]
    """Role -> the WorkerIds of its workers, in rank order."""
    timeout_s: float
    weights_folder: str


@dataclass(frozen=True)
class ModelSetting:
    """A setting through which a role reads models (an artifact id or unique prefix, a local HF folder, or
    `channel:NAME`; a list of them, or "" for none): rl.model_inputs stores each before the run, so the RL
    model's lineage and the stage's cache key name it by id and the workers get the stored folder."""

    section: str
    """"rl" or "reward"."""
    field: str
    kinds: tuple[str, ...] = ("model",)
    """The artifact kinds it accepts."""

    @property
    def name(self) -> str:
        return f"{self.section}.{self.field}"


@dataclass(frozen=True, kw_only=True)
class RoleSpec:
    name: str
    worker: Callable[[], type]
    """() -> the worker class: one Ray actor per rank (its module is imported only where the actors start: see
    "The role classes" below)."""
    group: Callable[[], type]
    """() -> the class of the controller-side group that fans calls out over the workers and merges."""
    trains: bool
    """True: it has an optimizer, so its state is checkpointed with the policy's and restored on resume (and
    its group is an SPMD torch.distributed group, set up once its workers start)."""
    kuberay_group: str
    """The RayJob worker group (custom resource) its bundles ask for on a cluster (tasks/rl.py)."""
    workers: Callable[[RunSettings], int]
    enabled: Callable[[RunSettings], bool]
    worker_kwargs: Callable[[RunSettings, int, int], dict[str, Any]]
    """(settings, rank, world size) -> the worker's constructor arguments by name (each binds to its class's
    `__init__`: tests/unit/test_role_registry.py)."""
    group_args: Callable[[GroupContext], dict] = lambda ctx: {}
    """Keyword arguments of the group's constructor beyond (workers, ids, timeout_s)."""
    reads_models: tuple[ModelSetting, ...] = ()
    """The settings that name models it loads (stored and put in the RL model's lineage by rl.model_inputs)."""
    scores: bool = False
    """True: it scores samples beside the reward functions (its group has `role`, `score` and `weighted`). Every
    loop's score phase asks each such role, in ROLES order, and adds its weighted scores to the reward - no loop
    names it."""
    compose: Callable[[RunSettings, dict[str, Any], int], dict[str, Any]] | None = None
    """(settings, the run's groups, model.max_seq_len) -> groups that stand in for other roles, built once every
    actor has started (composed.run_groups, after the roles the policy serves): the environment's rollout that
    plays episodes through it in place of the plain rollout group. None: it stands in for nothing."""
    preflight: Callable[[RunSettings], dict[str, str]] | None = None
    """Checks run in stages.rl before any actor starts (a bad import path, a chat template that cannot keep the
    role's tokens fails there, naming it), returning the user code it runs by source sha256 for the RL stage's
    cache key. None: nothing to check before its workers start."""
    code: tuple[str, ...] = ()
    """Our source it runs beyond what every RL run does (paths under src/posttrain/), in the RL stage's cache key
    when the role runs."""
    lineage: Callable[[Any], dict[str, str]] | None = None
    """(its group) -> what of the user's code it ran (by source sha256), kept in the RL model's manifest under
    the role's name, as the reward function's is. None: nothing of the user's."""
