"""Where each role's workers run: Ray placement groups sized to the cluster, and the one `ray.remote` call.

    plan = plan_placement(placement_cfg, counts=registry.role_counts(settings), available=ray.available_resources())
    pgs = create_placement_groups(plan, timeout_s=60)          # fails fast instead of hanging
    rollout = create_role_actors(RolloutWorker, plan.roles["rollout"], pgs, lambda rank: (model_dir, rank, 1))

Sizing. Ray never starts an actor whose CPU request does not fit - it waits silently, forever (five
actors at num_cpus=0.5 on 2 cores hang with no error). So the plan reads the cluster's free CPUs and gives every actor the same fractional share,
`min(1, free CPUs / number of actors)`, rounded down to 1e-4, so that all actors of the run fit by
construction. Fractional CPUs are a scheduling budget, not threads: policy ranks run `placement.torch_threads`
torch threads each, rollout and reference workers `placement.generation_threads` (1 by default).
GPU requests are `placement.gpus_per_worker` per actor; a plan asking for more GPUs than are free is
rejected before anything is created, and every placement group is awaited with a timeout.

Modes (`placement.mode`):
- COLOCATED: one placement group with one bundle per device slot (slots = the largest role's worker count).
  Worker i of every role goes to bundle i, so rollout, reward, reference and policy ranks of a slot share
  its device and take turns by phase (the controller runs one phase at a time).
- SPLIT: one placement group per role, one bundle per worker: no two roles share a device.

How roles map to KubeRay worker groups
--------------------------------------
The Ray task (tasks/rl.py) defines two worker groups: `rollout` (generation) and `train` (the SPMD policy
ranks; the reference and reward workers share it), plus the head, which runs only the controller actor
(num_cpus=0). Placement groups pin roles to those pods through a custom resource named after the worker
group: the task starts each group's Ray nodes advertising 1000 units of it (`group_resource_start_params`:
`ray_start_params={"resources": '{"rollout": 1000}'}`, resp. `"train"`), and every bundle of a role asks for
a sliver (0.001) of its group's resource (`RoleSpec.kuberay_group` in rl/roles/registry.py) - in SPLIT mode
rollout bundles then land on `rollout` pods and the other roles' bundles on `train` pods; in COLOCATED mode the shared bundles ask for `train`. When the
cluster advertises no such resource (local execution: a single node, worker groups ignored) the bundles carry
no such constraint. Each bundle must fit on one node: keep per-node pods at least as large as the largest
bundle.

Leaves out: multi-GPU tensor-parallel rollout engines (one bundle per worker), autoscaling, and
re-creating actors that die (the run fails and resumes from its last checkpoint).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.config import PlacementConfig, PlacementMode
from posttrain.rl.roles.registry import kuberay_group

GROUP_RESOURCE_SLIVER = 0.001
GROUP_RESOURCE_PER_NODE = 1000
"""Units of its group's custom resource each worker-group node advertises (tasks/rl.py): room for 1e6 bundles."""


def group_resource_start_params(group: str) -> dict[str, str]:
    """`ray start` parameters for a KubeRay worker group's nodes: advertise the custom resource named after the
    group, which every bundle of the roles mapped to it asks a sliver of (the value is a quoted JSON string)."""
    return {"resources": "'" + json.dumps({group: GROUP_RESOURCE_PER_NODE}) + "'"}


class PlacementError(RuntimeError):
    """The run's actors cannot be placed on this cluster (named: what was asked, what is free)."""


@dataclass(frozen=True, kw_only=True)
class PlacementGroupSpec:
    name: str
    """"colocated" (COLOCATED mode) or the role name (SPLIT mode)."""
    bundles: list[dict[str, float]]
    """One resource dict per bundle, e.g. {"CPU": 1.5, "GPU": 1.0}."""
    strategy: str = "PACK"


@dataclass(frozen=True, kw_only=True)
class RolePlacement:
    role: str
    group: str
    """Name of the PlacementGroupSpec holding this role's workers."""
    bundle_indices: list[int]
    """Bundle of each worker: rank i runs in bundle bundle_indices[i]."""
    num_cpus: float
    """Per actor (fractional; a scheduling budget)."""
    num_gpus: float


@dataclass(frozen=True, kw_only=True)
class PlacementPlan:
    mode: PlacementMode
    groups: list[PlacementGroupSpec]
    roles: dict[str, RolePlacement]

    def describe(self) -> str:
        pgs = "; ".join(f"{g.name}: {g.bundles}" for g in self.groups)
        roles = "; ".join(f"{r.role} x{len(r.bundle_indices)} in {r.group}{r.bundle_indices} "
                          f"({r.num_cpus} CPU, {r.num_gpus} GPU each)" for r in self.roles.values())
        return f"{self.mode.value} placement - groups: {pgs} - roles: {roles}"


def plan_placement(cfg: PlacementConfig, *, counts: dict[str, int], available: dict[str, float]) -> PlacementPlan:
    """A pure function of the config, the role -> worker count map (`registry.role_counts`) and the free
    resources (unit-testable without Ray)."""
    n_actors = sum(counts.values())
    free_cpu, free_gpu = float(available.get("CPU", 0.0)), float(available.get("GPU", 0.0))
    cpu = math.floor(min(1.0, free_cpu / n_actors) * 1e4) / 1e4
    if cpu <= 0:
        raise PlacementError(f"no free CPUs for {n_actors} role actors ({counts}); free resources: {available}")
    gpu = cfg.gpus_per_worker
    if gpu * n_actors > free_gpu + 1e-9:
        raise PlacementError(f"placement asks {gpu} GPU x {n_actors} actors ({counts}) = {gpu * n_actors} GPUs, "
                             f"but only {free_gpu} are free; lower placement.gpus_per_worker or the worker counts")

    def bundle(n: int, roles: list[str]) -> dict[str, float]:
        b = {"CPU": round(cpu * n, 4)}
        if gpu > 0:
            b["GPU"] = round(gpu * n, 4)
        group = kuberay_group("policy" if len(roles) > 1 else roles[0])
        if available.get(group, 0) >= GROUP_RESOURCE_SLIVER:
            b[group] = GROUP_RESOURCE_SLIVER
        return b

    if cfg.mode == PlacementMode.COLOCATED:
        slots = max(counts.values())
        members = [[r for r, n in counts.items() if n > j] for j in range(slots)]  # roles sharing slot j
        groups = [PlacementGroupSpec(name="colocated", bundles=[bundle(len(m), m) for m in members])]
        roles = {r: RolePlacement(role=r, group="colocated", bundle_indices=list(range(n)), num_cpus=cpu,
                                  num_gpus=gpu) for r, n in counts.items()}
    else:
        groups = [PlacementGroupSpec(name=r, bundles=[bundle(1, [r]) for _ in range(n)]) for r, n in counts.items()]
        roles = {r: RolePlacement(role=r, group=r, bundle_indices=list(range(n)), num_cpus=cpu, num_gpus=gpu)
                 for r, n in counts.items()}
    return PlacementPlan(mode=cfg.mode, groups=groups, roles=roles)


def create_placement_groups(plan: PlacementPlan, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Create and await every placement group; on timeout remove them all and raise PlacementError."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pgs = {g.name: placement_group(g.bundles, strategy=g.strategy, name=f"posttrain-rl-{g.name}")
           for g in plan.groups}
    try:
        ray.get([pg.ready() for pg in pgs.values()], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for pg in pgs.values():
            remove_placement_group(pg)
        raise PlacementError(f"placement groups not ready within {timeout_s:.0f}s - the cluster cannot hold "
                             f"{plan.describe()}; free now: {ray.available_resources()}") from None
    return pgs


def remove_placement_groups(pgs: dict[str, Any], *, timeout_s: float = 30.0) -> None:
    """Remove the groups and wait until Ray reports them removed (removal is asynchronous: a plan made
    right afterwards would otherwise see their CPUs as still taken)."""
    import time

    from ray.util.placement_group import placement_group_table, remove_placement_group

    for pg in pgs.values():
        remove_placement_group(pg)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(placement_group_table(pg).get("state") != "REMOVED"
                                              for pg in pgs.values()):
        time.sleep(0.05)


def free_resources(*, min_cpu: float, timeout_s: float = 30.0) -> dict[str, float]:
    """`ray.available_resources()` once at least `min_cpu` CPUs are free (or the timeout passed): resources of
    a run that just ended come back asynchronously."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    available = ray.available_resources()
    while available.get("CPU", 0.0) < min_cpu and time.monotonic() < deadline:
        time.sleep(0.1)
        available = ray.available_resources()
    return available


def create_role_actors(worker_cls: type, placement: RolePlacement, pgs: dict[str, Any],
                       init_args: Callable[[int], tuple]) -> list:
    """THE place that applies ray.remote: one actor per rank of `placement.role`, each pinned to its bundle.

    `init_args(rank)` gives the worker's constructor arguments.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote_cls = ray.remote(worker_cls)
    pg = pgs[placement.group]
    return [remote_cls.options(
        num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, max_restarts=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b),
    ).remote(*init_args(rank)) for rank, b in enumerate(placement.bundle_indices)]


def create_controller_actor(controller_cls: type, *args: Any) -> Any:
    """The controller actor: num_cpus=0 (it only waits on the role groups), outside every placement group;
    two threads, so the driver's watchdog can ask for its progress while `run` goes on."""
    import ray

    return ray.remote(controller_cls).options(num_cpus=0, max_restarts=0, max_concurrency=2).remote(*args)


def bundle_of(resource_names, pg_id: str) -> int | None:
    """The bundle index in placement group `pg_id` named by Ray's bundle resources `CPU_group_<index>_<pg id>`."""
    for key in resource_names:
        parts = key.split("_group_")
        if len(parts) == 2 and parts[1].endswith(pg_id):
            idx = parts[1][: -len(pg_id)].rstrip("_")
            if idx.isdigit():
                return int(idx)
    return None


def current_bundle() -> tuple[str | None, int | None]:
    """(placement group id, bundle index) of the calling actor, read from inside it.

    NOTE: the public `get_assigned_resources()` folds bundle resources back into plain "CPU"; the core
    worker's resource ids keep the bundle-indexed names, so this reads those (an internal Ray API)."""
    import ray

    ctx = ray.get_runtime_context()
    pg = ctx.get_placement_group_id()
    if pg is None:
        return None, None
    return pg, bundle_of(ctx.worker.core_worker.resource_ids(), pg)
