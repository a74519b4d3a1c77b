"""Every RL role, declared once: what runs it, whether it trains, where it is placed. Everything that names roles reads this table:

    reader                                   reads
    placement.plan_placement                 role_counts(settings) (worker counts), kuberay_group
    rl.run (actor start-up, restarts)        worker (the class), worker_kwargs, group, enabled
    rl.model_inputs (stages.rl: lineage)     reads_models: the settings naming models it loads
    Checkpointer (save, resume)              trains: every training role's state is saved and restored
    Controller (the algorithm's handles)     the built groups by name; an algorithm picks the ones it reads
    loops.common.score                       scores: every scoring role's weighted scores join the reward
    composed.run_groups                      compose: groups that stand in for other roles (the episodes' rollout)
    stages.rl (before any actor; cache key)  preflight, code: the role's checks and the code it runs
    rl.run (the RL model's manifest)         lineage: the user code its group ran
    metrics / Decks                          the phase and compute names are the role names

A role is one row of ROLES (a plain dict you can grep). Adding one means: its worker and group (own files),
the functions here that return those classes, its row here, its settings (config/rl_sections.py) and their
checks (config/rl_checks.py) - three shared files; the algorithm that reads it names it in its own roles
dataclass (rl/loops/), or, as a scorer or a stand-in, no loop names it. What a role hands the roles after it
beyond the samples travels in Trajectories' generic fields (`sampled`, `notes`, `sub_phase_s`, `transcripts`).
How a call fans out over the workers (one, all, split) is the group's own code.

Worker counts and whether a role runs are functions of the run's settings, so `posttrain plan` can show them
before anything starts. Constructor arguments are built here, not in `rl.run`, so the start-up code has no
role names in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from posttrain.config import RewardConfig, RLConfig
from posttrain.config.algorithms import declared
from posttrain.rl.roles.role_spec import GroupContext, ModelSetting, RoleSpec, RunSettings

if TYPE_CHECKING:
    from posttrain.rl.roles.critic import CriticWorker
    from posttrain.rl.roles.critic_group import CriticGroup
    from posttrain.rl.roles.environment import EnvironmentGroup, EnvironmentWorker
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.reference import ReferenceGroup, ReferenceWorker
    from posttrain.rl.roles.reward import RewardGroup, RewardWorker
    from posttrain.rl.roles.reward_model import RewardModelGroup, RewardModelWorker
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from posttrain.rl.roles.teacher import TeacherGroup, TeacherWorker


def _gen_threads(s: RunSettings) -> int:
    return s.placement.generation_threads


def _policy_shared_folder(ctx: GroupContext) -> dict:
    """Weights go through a shared-memory file only when every rollout worker is on policy rank 0's node; with
    no rollout workers (placement.rollout_workers 0) the policy ranks generate and nothing is handed over."""
    node = ctx.ids["policy"][0].node
    generates = policy_generates(ctx.settings)
    one_node = not generates and all(r.node == node for r in ctx.ids["rollout"])
    rl = ctx.settings.rl
    return {"micro_batch_size": rl.micro_batch_size, "shared_folder": ctx.weights_folder if one_node else None,
            "mini_batches": rl.mini_batches, "seed": rl.seed, "generates": generates}


def policy_generates(s: RunSettings) -> bool:
    return s.placement.rollout_workers == 0


def uses_reference(rl: RLConfig) -> bool:
    """Whether the run has a reference group: rl.kl_coef > 0 (the KL term needs the start model's log-probs;
    with no KL term it would be pure cost). Its own workers, or with `model.lora` the policy's (served_by_policy).
    The one statement of this rule: the registry's row and the controller's check read it."""
    return rl.kl_coef > 0


def uses_episodes(rl: RLConfig) -> bool:
    """Whether rollouts are multi-turn episodes: rl.environment or rl.tools set (the environment role starts and
    the rollout role runs episodes through it: episode_rollout)."""
    return bool(rl.environment or rl.tools)


def uses_lora(s: RunSettings) -> bool:
    return s.model is not None and s.model.lora is not None


# The role classes. Each is returned by a function that imports its module when called (build_group,
# rl.run.default_workers: where a run starts its actors) instead of at the top of this file, because the
# table is also read where no model runs - placement and through it tasks/rl.py and rehearsal/rayjob_shape.py
# (kuberay_group), model_inputs for stages.rl (reads_models) - and the role modules import torch and
# transformers (seconds per process; the task modules other than tasks/sft.py import neither).
# vLLM is never imported through them: rollout.py imports rollout_vllm only for rl.rollout_backend = "vllm".
# Go-to-definition on a class name below reaches the class.

def _rollout_worker() -> type[RolloutWorker]:
    from posttrain.rl.roles.rollout import RolloutWorker

    return RolloutWorker


def _environment_worker() -> type[EnvironmentWorker]:
    from posttrain.rl.roles.environment import EnvironmentWorker

    return EnvironmentWorker


def _environment_group() -> type[EnvironmentGroup]:
    from posttrain.rl.roles.environment import EnvironmentGroup

    return EnvironmentGroup


def _episode_compose() -> Callable[[RLConfig, RewardConfig, str, dict[str, Any], int], dict[str, Any]]:
    from posttrain.rl.roles.episode_rollout import compose

    return compose


def _check_episodes() -> Callable[[RLConfig, str], dict[str, str]]:
    from posttrain.envs.plan import check_episodes

    return check_episodes


def _rollout_group() -> type[RolloutGroup]:
    from posttrain.rl.roles.rollout import RolloutGroup

    return RolloutGroup


def _reward_worker() -> type[RewardWorker]:
    from posttrain.rl.roles.reward import RewardWorker

    return RewardWorker


def _reward_group() -> type[RewardGroup]:
    from posttrain.rl.roles.reward import RewardGroup

    return RewardGroup


def _reward_model_worker() -> type[RewardModelWorker]:
    from posttrain.rl.roles.reward_model import RewardModelWorker

    return RewardModelWorker


def _reward_model_group() -> type[RewardModelGroup]:
    from posttrain.rl.roles.reward_model import RewardModelGroup

    return RewardModelGroup


def _reference_worker() -> type[ReferenceWorker]:
    from posttrain.rl.roles.reference import ReferenceWorker

    return ReferenceWorker


def _reference_group() -> type[ReferenceGroup]:
    from posttrain.rl.roles.reference import ReferenceGroup

    return ReferenceGroup


def _teacher_worker() -> type[TeacherWorker]:
    from posttrain.rl.roles.teacher import TeacherWorker

    return TeacherWorker


def _teacher_group() -> type[TeacherGroup]:
    from posttrain.rl.roles.teacher import TeacherGroup

    return TeacherGroup


def _policy_worker() -> type[PolicyWorker]:
    from posttrain.rl.roles.policy import PolicyWorker

    return PolicyWorker


def _policy_group() -> type[PolicyGroup]:
    from posttrain.rl.roles.policy_group import PolicyGroup

    return PolicyGroup


def _critic_worker() -> type[CriticWorker]:
    from posttrain.rl.roles.critic import CriticWorker

    return CriticWorker


def _critic_group() -> type[CriticGroup]:
    from posttrain.rl.roles.critic_group import CriticGroup

    return CriticGroup


ROLES: dict[str, RoleSpec] = {
    "rollout": RoleSpec(
        name="rollout", worker=_rollout_worker, group=_rollout_group, trains=False,
        kuberay_group="rollout", workers=lambda s: s.placement.rollout_workers,
        enabled=lambda s: not policy_generates(s),
        worker_kwargs=lambda s, rank, n: {"model_dir": s.start_model_dir, "rank": rank, "world_size": n, "version": 0,
                                          "model_cfg": s.model, "backend": s.rl.rollout_backend,
                                          "threads": _gen_threads(s)}),
    "environment": RoleSpec(
        name="environment", worker=_environment_worker, group=_environment_group, trains=False,
        kuberay_group="train", workers=lambda s: s.placement.environment_workers, enabled=lambda s: uses_episodes(s.rl),
        worker_kwargs=lambda s, rank, n: {"environment": s.rl.environment, "tools": list(s.rl.tools),
                                          "episode": s.rl.episode, "rank": rank, "world_size": n},
        group_args=lambda ctx: {"source": ctx.settings.rl.environment or ", ".join(ctx.settings.rl.tools)},
        scores=True,
        compose=lambda s, groups, max_seq_len: _episode_compose()(s.rl, s.reward, s.start_model_dir, groups, max_seq_len),
        preflight=lambda s: _check_episodes()(s.rl, s.start_model_dir), code=("envs",),
        lineage=lambda group: group.identity),
    "reward": RoleSpec(
        name="reward", worker=_reward_worker, group=_reward_group, trains=False, kuberay_group="train",
        workers=lambda s: s.placement.reward_workers, enabled=lambda s: True,
        worker_kwargs=lambda s, rank, n: {"reward_cfg": s.reward, "rank": rank, "world_size": n},
        group_args=lambda ctx: {"weight": ctx.settings.reward.fn_weight}),
    "reward_model": RoleSpec(
        name="reward_model", worker=_reward_model_worker, group=_reward_model_group, trains=False,
        kuberay_group="train", workers=lambda s: s.placement.reward_model_workers,
        enabled=lambda s: bool(s.reward.models),
        worker_kwargs=lambda s, rank, n: {"models": s.reward.models, "rank": rank, "world_size": n,
                                          "model_cfg": s.model, "threads": _gen_threads(s)},
        group_args=lambda ctx: {"models": ctx.settings.reward.models,
                                "weights": ctx.settings.reward.model_weights or [1.0] * len(ctx.settings.reward.models)},
        reads_models=(ModelSetting("reward", "models", kinds=("reward_model", "model")),), scores=True),
    "reference": RoleSpec(
        name="reference", worker=_reference_worker, group=_reference_group, trains=False, kuberay_group="train",
        workers=lambda s: s.placement.reference_workers, enabled=lambda s: uses_reference(s.rl) and not uses_lora(s),
        worker_kwargs=lambda s, rank, n: {"model_dir": s.start_model_dir, "rank": rank, "world_size": n, "cfg": s.rl,
                                          "model_cfg": s.model, "threads": _gen_threads(s)}),
    "teacher": RoleSpec(
        name="teacher", worker=_teacher_worker, group=_teacher_group, trains=False, kuberay_group="train",
        workers=lambda s: s.placement.teacher_workers, enabled=lambda s: declared(s.rl.algorithm).teacher,
        worker_kwargs=lambda s, rank, n: {"teacher_dir": s.rl.teacher, "student_dir": s.start_model_dir, "rank": rank,
                                          "world_size": n, "cfg": s.rl, "model_cfg": s.model,
                                          "threads": _gen_threads(s)},
        reads_models=(ModelSetting("rl", "teacher"),)),
    "policy": RoleSpec(
        name="policy", worker=_policy_worker, group=_policy_group, trains=True, kuberay_group="train",
        workers=lambda s: s.placement.policy_workers, enabled=lambda s: True,
        worker_kwargs=lambda s, rank, n: {"model_dir": s.start_model_dir, "cfg": s.rl, "rank": rank, "world_size": n,
                                          "model_cfg": s.model, "threads": s.placement.torch_threads},
        group_args=_policy_shared_folder),
    "critic": RoleSpec(
        name="critic", worker=_critic_worker, group=_critic_group, trains=True,
        kuberay_group="train", workers=lambda s: s.placement.critic_workers or s.placement.policy_workers,
        enabled=lambda s: declared(s.rl.algorithm).critic,
        worker_kwargs=lambda s, rank, n: {"init_dir": s.rl.critic_init or s.start_model_dir, "cfg": s.rl, "rank": rank,
                                          "world_size": n, "model_cfg": s.model, "threads": s.placement.torch_threads},
        group_args=lambda ctx: {"micro_batch_size": ctx.settings.rl.micro_batch_size,
                                "mini_batches": ctx.settings.rl.mini_batches, "seed": ctx.settings.rl.seed,
                                "epochs": ctx.settings.rl.inner_epochs},
        reads_models=(ModelSetting("rl", "critic_init", kinds=("reward_model", "model")),)),
}
"""Role name -> declaration, in the order roles start and phases run."""


def active_roles(s: RunSettings) -> dict[str, RoleSpec]:
    """The roles this run creates (in ROLES order)."""
    return {name: spec for name, spec in ROLES.items() if spec.enabled(s)}


def role_counts(s: RunSettings) -> dict[str, int]:
    """Role -> number of workers, for the roles this run creates."""
    return {name: spec.workers(s) for name, spec in active_roles(s).items()}


def kuberay_group(role: str) -> str:
    return ROLES[role].kuberay_group


def build_group(spec: RoleSpec, workers: list, ids: list, ctx: GroupContext) -> Any:
    """The role's group around its started workers; an SPMD (training) group also forms its process group."""
    group = spec.group()(workers, ids, ctx.timeout_s, **spec.group_args(ctx))
    if spec.trains:
        group.setup()  # the SPMD ranks join one torch.distributed group
    return group


def stand_ins(s: RunSettings, groups: dict[str, Any], max_seq_len: int) -> dict[str, Any]:
    """Every active role's stand-ins (its row's `compose`), in ROLES order."""
    out: dict[str, Any] = {}
    for spec in active_roles(s).values():
        if spec.compose is not None:
            out.update(spec.compose(s, {**groups, **out}, max_seq_len))
    return out


def preflight(s: RunSettings, start_model_dir: Callable[[], str]) -> tuple[list[dict[str, str]], tuple[str, ...]]:
    """Every active role's checks before any actor starts (its row's `preflight`), in ROLES order: what each
    returned that is not empty (the user code it runs, for the cache key), and the roles' own source (`code`).
    `start_model_dir` is asked for (a LoRA start model's merged folder) only when some role checks something,
    so a run without such a role - or its cache hit - never builds it."""
    roles = list(active_roles(s).values())
    if any(spec.preflight is not None for spec in roles):
        s = replace(s, start_model_dir=start_model_dir())
    checked = [spec.preflight(s) for spec in roles if spec.preflight is not None]
    return [c for c in checked if c], tuple(path for spec in roles for path in spec.code)


def lineage(s: RunSettings, groups: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Role -> the user code its group ran (its row's `lineage`), for the RL model's manifest."""
    return {name: spec.lineage(groups[name]) for name, spec in active_roles(s).items()
            if spec.lineage is not None and name in groups}


def scoring_roles() -> tuple[str, ...]:
    """The roles that score samples beside the reward functions, in ROLES order."""
    return tuple(name for name, spec in ROLES.items() if spec.scores)


def scoring_groups(groups: dict[str, Any]) -> tuple[Any, ...]:
    """This run's scoring groups (registry `scores=True`), in ROLES order: what loops read as `scorers`."""
    return tuple(groups[name] for name in scoring_roles() if groups.get(name) is not None)


def training_roles(groups: dict[str, Any]) -> dict[str, Any]:
    """The groups of the roles that train (checkpointed and restored), in ROLES order, the policy first."""
    return {name: g for name, g in groups.items() if ROLES.get(name) is not None and ROLES[name].trains}


__all__ = [
    "ROLES",
    "GroupContext",
    "ModelSetting",
    "RoleSpec",
    "RunSettings",
    "active_roles",
    "build_group",
    "kuberay_group",
    "lineage",
    "policy_generates",
    "preflight",
    "role_counts",
    "scoring_groups",
    "scoring_roles",
    "stand_ins",
    "training_roles",
    "uses_episodes",
    "uses_lora",
    "uses_reference",
]
