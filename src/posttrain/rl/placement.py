"""Where each role's workers run: Ray placement groups sized to the cluster, and the one `ray.remote` call.

    plan = plan_placement(placement_cfg, counts=registry.role_counts(settings), available=ray.available_resources(),
                          nodes=cluster_nodes())
    pgs = create_placement_groups(plan, timeout_s=60)          # fails fast instead of hanging
    rollout = create_role_actors(RolloutWorker, plan.roles["rollout"], pgs, lambda rank: {"model_dir": model_dir, "rank": rank, "world_size": 1})

Sizing. Ray never starts an actor whose CPU request does not fit - it waits silently, forever (five
actors at num_cpus=0.5 on 2 cores hang with no error). So every actor's share is chosen so that all actors of
the run fit by construction:
- one local node (worker groups ignored): the same fractional share for all, `min(1, free CPUs / actors)`,
  rounded down to 1e-4;
- a cluster of worker-group pods (KubeRay, or the rehearsal in tests/cluster/): per group, the largest share
  <= 1 at which that group's bundles fit ITS pods one by one (`_plan_on_pods`) - a bundle must fit on one
  pod, so cluster totals say nothing. A bundle no pod can hold fails at plan time, naming group, bundle and pods.
Fractional CPUs are a scheduling budget, not threads: policy ranks run `placement.torch_threads`
torch threads each, rollout and reference workers `placement.generation_threads` (1 by default).
Every worker process starts with `placement.worker_env_vars()` in its environment (glibc's malloc arenas
capped: `placement.malloc_arena_max`), through the actor's Ray runtime_env - on a local Ray and a KubeRay pod alike.
GPU requests are `placement.gpus_per_worker` per actor; a plan asking for more GPUs than are free is
rejected before anything is created, and every placement group is awaited with a timeout.

Modes (`placement.mode`):
- COLOCATED: one placement group with one bundle per device slot (slots = the largest role's worker count).
  Worker i of every role goes to bundle i, so rollout, reward, reference and policy ranks of a slot share
  its device and take turns by phase (the controller runs one phase at a time). On worker-group pods, roles
  of different groups cannot share a pod: slot i holds worker i of every role OF ONE GROUP (the train roles
  together, the rollout workers on their own pods).
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
no such constraint. Each bundle must fit on one node; the plan sizes shares per pod so that it does.

Leaves out: multi-GPU tensor-parallel rollout engines (one bundle per worker), autoscaling, and
re-creating actors that die (the run fails and resumes from its last checkpoint).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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


class NoPodsError(PlacementError):
    """No live node serves a worker group the run needs (its pods are missing, or lost and not back yet)."""


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
    env_vars: dict[str, str] = field(default_factory=dict)
    """Environment each worker process starts with, on top of the job's (`PlacementConfig.worker_env_vars`)."""


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


@dataclass(frozen=True, kw_only=True)
class Node:
    """One Ray node (on KubeRay: one pod) as the plan sees it."""

    name: str
    """For messages: the pod's name in a rehearsal, else the node's IP and short id."""
    resources: dict[str, float]
    """Its total resources: CPU, GPU, memory, and the worker group's custom resource."""


def cluster_nodes() -> list[Node]:
    """The live nodes of the connected Ray cluster with their total resources."""
    import ray

    return [Node(name=f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})", resources=dict(n["Resources"]))
            for n in ray.nodes() if n.get("Alive")]


def plan_placement(cfg: PlacementConfig, *, counts: dict[str, int], available: dict[str, float],
                   nodes: Sequence[Node] = ()) -> PlacementPlan:
    """A pure function of the config, the role -> worker count map (`registry.role_counts`), the free
    resources and the cluster's nodes (unit-testable without Ray).

    Nodes that advertise worker-group resources (a KubeRay cluster, or a rehearsal shaped like one) get the
    per-pod plan, `_plan_on_pods`: each role's bundles fit its own group's pods by construction. Otherwise (one
    local node that ignores the worker groups) every actor gets the same share of the free CPUs. Every role
    gets the config's worker environment."""
    counts = {r: n for r, n in counts.items() if n > 0}
    groups_of = {r: kuberay_group(r) for r in counts}
    if any(n.resources.get(g, 0) >= GROUP_RESOURCE_SLIVER for n in nodes for g in groups_of.values()):
        plan = _plan_on_pods(cfg, counts, groups_of, nodes)
    else:
        plan = _plan_on_one_node(cfg, counts, available)
    env = cfg.worker_env_vars()
    return replace(plan, roles={r: replace(p, env_vars=dict(env)) for r, p in plan.roles.items()})


def _plan_on_one_node(cfg: PlacementConfig, counts: dict[str, int], available: dict[str, float]) -> PlacementPlan:
    """One local node: every actor gets the same share of the free CPUs (module docstring)."""
    n_actors = sum(counts.values())
    free_cpu, free_gpu = float(available.get("CPU", 0.0)), float(available.get("GPU", 0.0))
    cpu = math.floor(min(1.0, free_cpu / n_actors) * 1e4) / 1e4
    if cpu <= 0:
        raise PlacementError(f"no free CPUs for {n_actors} role actors ({counts}); free resources: {available}")
    gpu = cfg.gpus_per_worker
    if gpu * n_actors > free_gpu + 1e-9:
        raise PlacementError(f"placement asks {gpu} GPU x {n_actors} actors ({counts}) = {gpu * n_actors} GPUs, "
                             f"but only {free_gpu} are free; lower placement.gpus_per_worker or the worker counts")

    def bundle(n: int) -> dict[str, float]:
        return {"CPU": round(cpu * n, 4), **({"GPU": round(gpu * n, 4)} if gpu > 0 else {})}

    if cfg.mode == PlacementMode.COLOCATED:
        slots = max(counts.values())
        members = [[r for r, n in counts.items() if n > j] for j in range(slots)]  # roles sharing slot j
        groups = [PlacementGroupSpec(name="colocated", bundles=[bundle(len(m)) for m in members])]
        roles = {r: RolePlacement(role=r, group="colocated", bundle_indices=list(range(n)), num_cpus=cpu,
                                  num_gpus=gpu) for r, n in counts.items()}
    else:
        groups = [PlacementGroupSpec(name=r, bundles=[bundle(1) for _ in range(n)]) for r, n in counts.items()]
        roles = {r: RolePlacement(role=r, group=r, bundle_indices=list(range(n)), num_cpus=cpu, num_gpus=gpu)
                 for r, n in counts.items()}
    return PlacementPlan(mode=cfg.mode, groups=groups, roles=roles)


def _plan_on_pods(cfg: PlacementConfig, counts: dict[str, int], groups_of: dict[str, str],
                  nodes: Sequence[Node]) -> PlacementPlan:
    """The plan for a cluster of worker-group pods. Each worker group is planned on its own pods:

    - its bundles: SPLIT, one per actor; COLOCATED, one per slot j holding worker j of every role of the group
      (roles of different groups run on different pods, so they cannot share a bundle: the rollout workers
      colocate among themselves, the train roles - policy ranks, reward, reference - among themselves);
    - the per-actor CPU share: the largest (<= 1, in steps of 1e-4) at which the bundles, largest first, fit
      the group's pods first-fit - so Ray can place them all, per pod, not just in cluster totals;
    - a bundle that fits no pod even at the smallest share (GPUs, or pods without CPUs) fails here, naming
      the group, the bundle and the pods.
    """
    gpu = cfg.gpus_per_worker
    by_group: dict[str, list[str]] = {}
    for r in counts:
        by_group.setdefault(groups_of[r], []).append(r)
    all_groups = sorted({g for n in nodes for g in n.resources if g in set(groups_of.values())})
    share: dict[str, float] = {}  # role -> its group's per-actor CPU share
    slots: list[tuple[str, list[list[str]]]] = []  # (group, the roles in each of its bundles)
    for g, members_g in by_group.items():
        pods = [n for n in nodes if n.resources.get(g, 0) >= GROUP_RESOURCE_SLIVER]
        if not pods:
            raise NoPodsError(f"placement: role(s) {members_g} run on the `{g}` worker group, but no node of this "
                              f"Ray cluster advertises the `{g}` resource (groups present: {all_groups}; nodes: "
                              f"{[n.name for n in nodes]}) - the RayJob's `{g}` group is missing or has no pods")
        if cfg.mode == PlacementMode.COLOCATED:
            bundles = [[r for r in members_g if counts[r] > j] for j in range(max(counts[r] for r in members_g))]
        else:
            bundles = [[r] for r in members_g for _ in range(counts[r])]
        cpu = _largest_fitting_share([len(m) for m in bundles], pods, gpu, g)
        share.update(dict.fromkeys(members_g, cpu))
        slots.append((g, bundles))
    if cfg.mode == PlacementMode.COLOCATED:
        specs, placed = [], {}
        for g, bundles in slots:
            for m in bundles:
                for r in m:
                    placed.setdefault(r, []).append(len(specs))
                specs.append(_pod_bundle(len(m), share[m[0]], gpu, g))
        return PlacementPlan(mode=cfg.mode, groups=[PlacementGroupSpec(name="colocated", bundles=specs)],
                             roles={r: RolePlacement(role=r, group="colocated", bundle_indices=placed[r],
                                                     num_cpus=share[r], num_gpus=gpu) for r in counts})
    return PlacementPlan(
        mode=cfg.mode,
        groups=[PlacementGroupSpec(name=r, bundles=[_pod_bundle(1, share[r], gpu, groups_of[r]) for _ in range(n)])
                for r, n in counts.items()],
        roles={r: RolePlacement(role=r, group=r, bundle_indices=list(range(n)), num_cpus=share[r], num_gpus=gpu)
               for r, n in counts.items()})


def _pod_bundle(actors: int, cpu: float, gpu: float, group: str) -> dict[str, float]:
    b = {"CPU": round(cpu * actors, 4), group: GROUP_RESOURCE_SLIVER}
    if gpu > 0:
        b["GPU"] = round(gpu * actors, 4)
    return b


def _fits(sizes: list[int], pods: Sequence[Node], cpu: float, gpu: float) -> int | None:
    """None if bundles of `sizes` actors (largest first) fit the pods first-fit at `cpu`/`gpu` per actor, else
    the index (in `sizes`) of the first bundle that found no pod."""
    free = [[n.resources.get("CPU", 0.0), n.resources.get("GPU", 0.0)] for n in pods]
    for j in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
        c, g = round(cpu * sizes[j], 4), gpu * sizes[j]
        pod = next((p for p in free if p[0] + 1e-9 >= c and p[1] + 1e-9 >= g), None)
        if pod is None:
            return j
        pod[0] -= c
        pod[1] -= g
    return None


def _largest_fitting_share(sizes: list[int], pods: Sequence[Node], gpu: float, group: str) -> float:
    """The largest per-actor CPU share <= 1 (floored to 1e-4) at which the bundles fit the group's pods."""
    candidates = {1.0} | {n.resources.get("CPU", 0.0) / k for n in pods for k in range(1, sum(sizes) + 1)}
    for share in sorted((math.floor(min(1.0, c) * 1e4) / 1e4 for c in candidates), reverse=True):
        if share > 0 and _fits(sizes, pods, share, gpu) is None:
            return share
    j = _fits(sizes, pods, 1e-4, gpu)
    bundle = {"CPU": round(1e-4 * sizes[j], 4), "GPU": gpu * sizes[j], group: GROUP_RESOURCE_SLIVER}
    raise PlacementError(f"placement: bundle {j} of the `{group}` worker group ({sizes[j]} actor(s): {bundle} at the "
                         f"smallest CPU share) fits on none of its pods: "
                         + "; ".join(f"{n.name}: {n.resources.get('CPU', 0.0)} CPU, {n.resources.get('GPU', 0.0)} GPU"
                                     for n in pods)
                         + " - lower placement.gpus_per_worker or the worker counts, or give the group more pods")


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
                       init_kwargs: Callable[[int], dict[str, Any]]) -> list:
    """THE place that applies ray.remote: one actor per rank of `placement.role`, each pinned to its bundle.

    `init_kwargs(rank)` gives the worker's constructor arguments, by name; the process starts with
    `placement.env_vars`.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote_cls = ray.remote(worker_cls)
    pg = pgs[placement.group]
    return [remote_cls.options(
        num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, max_restarts=0,
        runtime_env={"env_vars": dict(placement.env_vars)} if placement.env_vars else None,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b),
    ).remote(**init_kwargs(rank)) for rank, b in enumerate(placement.bundle_indices)]


HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node alone."""


def create_controller_actor(controller_cls: type, *args: Any) -> Any:
    """The controller actor: num_cpus=0 (it only waits on the role groups), outside every placement group, on
    the head node (a sliver of its head-only resource): on KubeRay the head pod runs the job's driver and no
    worker group, so losing a worker pod never takes the controller with it - measured in the rehearsal, a
    controller left to land anywhere sat on the removed pod and cost a second restart. Two threads, so the
    driver's watchdog can ask for its progress while `run` goes on."""
    import ray

    return ray.remote(controller_cls).options(num_cpus=0, max_restarts=0, max_concurrency=2,
                                              resources={HEAD_RESOURCE: GROUP_RESOURCE_SLIVER}).remote(*args)


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
