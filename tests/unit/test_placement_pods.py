"""The placement plan on a cluster of worker-group pods: every bundle fits its own group's pods, per pod."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import PlacementConfig, PlacementMode
from posttrain.rl import placement as pl
from rehearsal.rayjob_shape import cpu_quantity, memory_quantity, pods


def _rayjob_nodes():
    from tasks.rl import ray_config

    return [p.node() for p in pods(ray_config)]


def _fits_per_pod(plan: pl.PlacementPlan, nodes: list[pl.Node]) -> dict[str, list[int]]:
    """Place every bundle first-fit on a pod of its group as Ray would have to; fail if one cannot go anywhere.
    Returns pod name -> the bundles' global indices it got."""
    free = {n.name: dict(n.resources) for n in nodes}
    where: dict[str, list[int]] = {}
    k = 0
    for g in plan.groups:
        for b in g.bundles:
            pod = next((name for name, r in free.items()
                        if all(r.get(key, 0.0) + 1e-9 >= v for key, v in b.items())), None)
            assert pod is not None, f"bundle {b} of {g.name} fits no pod: {free}"
            for key, v in b.items():
                free[pod][key] -= v
            where.setdefault(pod, []).append(k)
            k += 1
    return where


def test_the_rayjob_declares_a_head_one_rollout_pod_and_two_train_pods():
    got = {p.name: (p.group, p.num_cpus, p.resources) for p in pods(__import__("tasks.rl").rl.ray_config)}
    assert got == {"head": ("head", 1.0, {}), "rollout-0": ("rollout", 2.0, {"rollout": 1000.0}),
                   "train-0": ("train", 2.0, {"train": 1000.0}), "train-1": ("train", 2.0, {"train": 1000.0})}


@pytest.mark.parametrize("kl", [False, True])
@pytest.mark.parametrize("mode", [PlacementMode.COLOCATED, PlacementMode.SPLIT])
def test_the_default_roles_fit_the_rayjobs_pods_in_both_modes(mode, kl):
    counts = {"rollout": 1, "reward": 1, "policy": 2, **({"reference": 1} if kl else {})}
    nodes = _rayjob_nodes()
    plan = pl.plan_placement(PlacementConfig(mode=mode), counts=counts, available={"CPU": 7.0}, nodes=nodes)
    where = _fits_per_pod(plan, nodes)
    assert "head" not in where  # the head runs only the controller (0 CPU)
    for g in plan.groups:  # every bundle asks for its group's resource: rollout on rollout pods, the rest on train
        for b in g.bundles:
            assert set(b) & {"rollout", "train"}, b
    rollout = plan.roles["rollout"]
    group = next(g for g in plan.groups if g.name == rollout.group)
    assert all("rollout" in group.bundles[i] for i in rollout.bundle_indices)
    for role in ("policy", "reward"):
        rp = plan.roles[role]
        group = next(g for g in plan.groups if g.name == rp.group)
        assert all("train" in group.bundles[i] for i in rp.bundle_indices), role
    # the shares are as large as the pods allow: a rollout worker alone on its 2-CPU pod gets 1 CPU
    assert rollout.num_cpus == 1.0
    if mode == PlacementMode.COLOCATED:  # policy rank 0 shares its bundle with reward (and reference)
        assert plan.roles["policy"].bundle_indices[0] == plan.roles["reward"].bundle_indices[0]
        assert plan.roles["policy"].num_cpus == (0.6666 if kl else 1.0)


def test_per_pod_not_cluster_totals():
    """The reported failure: with a reference, COLOCATED puts reward, reference and policy rank 0 in one bundle.
    A share of the cluster's total CPUs (7 CPUs / 5 actors -> 1 CPU each) makes that bundle 3 CPUs, which no
    2-CPU train pod holds; the per-pod plan gives the train actors 2/3 CPU, and every bundle fits."""
    nodes = _rayjob_nodes()
    train = [n for n in nodes if "train" in n.resources]
    counts = {"rollout": 1, "reward": 1, "reference": 1, "policy": 2}
    assert pl._fits([3, 1], train, min(1.0, 7.0 / 5), 0.0) == 0  # the cluster-total share: bundle 0 fits nowhere
    plan = pl.plan_placement(PlacementConfig(mode=PlacementMode.COLOCATED), counts=counts, available={}, nodes=nodes)
    _fits_per_pod(plan, nodes)
    assert plan.groups[0].bundles == [{"CPU": 1.0, "rollout": pl.GROUP_RESOURCE_SLIVER}, {"CPU": 1.9998, "train": pl.GROUP_RESOURCE_SLIVER},
                                          {"CPU": 0.6666, "train": pl.GROUP_RESOURCE_SLIVER}]


def test_a_missing_group_or_a_bundle_no_pod_holds_fails_at_plan_time_naming_it():
    train_only = [pl.Node(name="train-0", resources={"CPU": 2.0, "train": 1000.0})]
    with pytest.raises(pl.PlacementError, match=r"`rollout` worker group.*no node.*train-0"):
        pl.plan_placement(PlacementConfig(), counts={"rollout": 1, "policy": 1}, available={}, nodes=train_only)
    nodes = train_only + [pl.Node(name="rollout-0", resources={"CPU": 2.0, "GPU": 1.0, "rollout": 1000.0})]
    with pytest.raises(pl.PlacementError, match=r"bundle 0 of the `train` worker group.*train-0: 2.0 CPU, 0.0 GPU"):
        pl.plan_placement(PlacementConfig(gpus_per_worker=1.0), counts={"rollout": 1, "policy": 1}, available={},
                          nodes=nodes)


def test_a_single_local_node_keeps_the_equal_share_of_free_cpus():
    local = [pl.Node(name="local", resources={"CPU": 2.0})]
    plan = pl.plan_placement(PlacementConfig(), counts={"rollout": 1, "reward": 1, "reference": 1, "policy": 2},
                             available={"CPU": 2.0}, nodes=local)
    assert {r.num_cpus for r in plan.roles.values()} == {0.4}
    assert not any("train" in b or "rollout" in b for g in plan.groups for b in g.bundles)


def test_kubernetes_quantities():
    assert cpu_quantity("500m") == 0.5 and cpu_quantity("2") == 2.0
    assert memory_quantity("4Gi") == 4 * 2**30 and memory_quantity("512Mi") == 512 * 2**20
    assert memory_quantity("2G") == 2 * 10**9
    with pytest.raises(ValueError, match="4GB"):
        memory_quantity("4GB")


def test_the_role_table_returns_its_classes_and_reading_it_imports_no_model_code():
    """Each registry row's `worker` / `group` returns the class itself (nothing named by a string); placement and
    the RayJob task read the table without importing torch, transformers or vLLM (the classes import them)."""
    code = ("import inspect, sys; import posttrain.rl.placement, posttrain.rl.model_inputs, tasks.rl; "
            "from posttrain.rl.roles.registry import ROLES; "
            "heavy = {'torch', 'transformers', 'vllm'} & set(sys.modules); assert not heavy, heavy; "
            "got = {n: (s.worker(), s.group()) for n, s in ROLES.items()}; "
            "assert all(inspect.isclass(w) and w.__name__.endswith('Worker') and inspect.isclass(g) "
            "and g.__name__.endswith('Group') for w, g in got.values()), got; "
            "assert 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180, cwd=Path(__file__).parents[2])
