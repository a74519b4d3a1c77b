"""Cluster rehearsal: RL on a local multi-node Ray cluster built from the RL task's own RayJobConfig - one Ray
node per pod (a 1-CPU head, the `rollout` pod, two `train` pods), each with its pod's CPUs, memory and `ray
start` resources - in both placement modes with the default recipe's RL settings (only fewer steps); then a
pod dies mid-run (the rollout pod, then a train pod) and a fresh one joins, as KubeRay would recreate it.

The cluster captures every bare `ray.init()` on the machine while it runs (shared/FACTS.md): this module runs
in its own pytest process (`make test`: `pytest -m "cluster and ray"`), and the cluster is torn down in a `finally`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from posttrain.config import PlacementMode, TrackingConfig
from posttrain.recipes import tiny_cpu
from posttrain.rl.roles.policy import PolicyWorker
from posttrain.rl.roles.rollout import RolloutWorker
from rehearsal.rayjob_shape import add_node

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

RECIPE = tiny_cpu()
CFG = replace(RECIPE.rl, steps=4, checkpoint_every=2, remote_timeout_s=120)
"""The default recipe's RL settings (128 prompts x 8 samples, lr, warm-up), 4 steps, a checkpoint every 2."""


@pytest.fixture(scope="module")
def rayjob():
    """{"ray", "cluster", "pods": pod name -> (Pod, Ray node)}: the RL task's RayJob as local Ray nodes."""
    ray = pytest.importorskip("ray")
    from rehearsal.rayjob_shape import local_cluster
    from tasks.rl import ray_config

    assert not ray.is_initialized(), "the rehearsal needs its own pytest process (pytest -m 'cluster and ray')"
    with local_cluster(ray_config) as (cluster, nodes):
        yield {"ray": ray, "cluster": cluster, "pods": nodes}


def _run(tmp_path: Path, tiny, mode: PlacementMode, workers=None, tag: str = "run"):
    from posttrain.artifacts import ArtifactStore
    from posttrain.rl.run import run_rl

    store = ArtifactStore(tmp_path / "store")
    model = store.put("model", "sft", tiny["model_dir"], run_id="t", parents=[], config={})
    data = store.put("dataset", "addition", tiny["dataset_dir"], run_id="t", parents=[], config={})
    return run_rl(rl_cfg=CFG, reward_cfg=RECIPE.reward, placement_cfg=replace(RECIPE.placement, mode=mode),
                  model_cfg=RECIPE.model, max_seq_len=RECIPE.model.max_seq_len,
                  tracking_cfg=TrackingConfig(wandb=False), start_model_dir=tiny["model_dir"],
                  dataset_dir=tiny["dataset_dir"], store_root=str(store.root), run_id="rehearsal",
                  parents=[model.id, data.id], state_dir=tmp_path / f"state-{tag}", start_model_id=model.id,
                  workers=workers)


def _pod_of(rayjob, node12: str) -> str:
    return next(name for name, (_, node) in rayjob["pods"].items() if node.node_id.startswith(node12))


@pytest.fixture(scope="module")
def uninterrupted(rayjob, tiny_sft_model, tmp_path_factory):
    return {mode: _run(tmp_path_factory.mktemp(mode.value), tiny_sft_model, mode)
            for mode in (PlacementMode.COLOCATED, PlacementMode.SPLIT)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [PlacementMode.COLOCATED, PlacementMode.SPLIT])
def test_the_default_rl_runs_on_the_rayjobs_pods_with_every_role_on_its_group(rayjob, uninterrupted, mode):
    res = uninterrupted[mode]
    assert res.steps == 4 and [m.policy_version for m in res.history] == [1, 2, 3, 4] and res.restarts == 0
    where = {role: [_pod_of(rayjob, n) for n in nodes] for role, nodes in res.placement["nodes"].items()}
    assert [p.split("-")[0] for p in where["rollout"]] == ["rollout"]
    for role in ("policy", "reward"):
        assert all(p.startswith("train-") for p in where[role]), where
    if mode == PlacementMode.COLOCATED:  # slot 0 (policy rank 0 + reward, 2 CPUs) fills a train pod
        assert len(set(where["policy"])) == 2, where
    # the weights crossed from a train pod to the rollout pod, each sync checked by version and checksum
    assert res.placement["weights"].startswith("Ray's object store")
    assert all(m.drift < CFG.drift_threshold for m in res.history)
    assert "head" not in {p for ps in where.values() for p in ps}


def blocks_at(role: str, marker: Path, at_call: int) -> type:
    """The role's worker class, except that rank 0's `at_call`-th step call writes its Ray node id to `marker`
    and waits there (until its pod is removed under it) - once per test: the rebuilt actor works normally."""
    base, method = {"rollout": (RolloutWorker, "generate"), "policy": (PolicyWorker, "update")}[role]

    def call(self, *args, **kwargs):
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls == at_call and not os.path.exists(self.marker) and getattr(self, "rank", 0) == 0:
            import ray

            Path(self.marker).write_text(ray.get_runtime_context().get_node_id())
            time.sleep(600)
        return getattr(base, method)(self, *args, **kwargs)

    return type(f"BlocksAt{role.title()}", (base,), {"marker": str(marker), method: call})


@pytest.mark.timeout(900)
@pytest.mark.parametrize("role", ["rollout", "policy"])
def test_a_pod_removed_mid_run_is_replaced_and_the_run_ends_as_if_uninterrupted(rayjob, uninterrupted, role,
                                                                               tiny_sft_model, tmp_path, capfd):
    """Step 3: the pod under the rollout worker (the `rollout` pod), resp. under policy rank 0 (a `train` pod),
    is removed; a fresh pod of its group joins 5 s later. The run rebuilds its actors on the pods there are,
    resumes from the step-2 checkpoint (written by a process on the lost pod, read on another: the store is
    shared) and ends with the uninterrupted run's model."""
    ray, cluster = rayjob["ray"], rayjob["cluster"]
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = tmp_path / "blocked"
    out: dict = {}

    def run():  # the driver; pods are started and removed from the main thread (Ray's node start needs it)
        try:
            out["res"] = _run(tmp_path, tiny_sft_model, PlacementMode.COLOCATED,
                              workers={role: blocks_at(role, marker, 3)})
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 600
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline and t.is_alive(), f"the worker never reached step 3: {out}"
        time.sleep(0.2)
    name = _pod_of(rayjob, marker.read_text()[:12])
    pod, node = rayjob["pods"].pop(name)
    cluster.remove_node(node, allow_graceful=False)
    time.sleep(5.0)  # KubeRay notices the lost pod and starts a new one
    rayjob["pods"][name] = (pod, add_node(cluster, pod))
    t.join(timeout=600)
    assert not t.is_alive(), "the run did not end within 600 s of the new pod"
    if "error" in out:
        raise out["error"]
    res = out["res"]
    assert name.startswith("rollout" if role == "rollout" else "train"), name
    assert res.restarts == 1 and [m.step for m in res.history] == [1, 2, 3, 4]
    assert res.model.id == uninterrupted[PlacementMode.COLOCATED].model.id
    out = capfd.readouterr().out
    assert "WorkerLostError" in out and "restart 1/2" in out
