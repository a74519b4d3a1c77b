"""The tasks serialize offline for a cluster exactly as defined: Elastic process/replica counts (set at
definition time through tasks/settings.py), the Ray task's role-named worker groups, and the launch plan's
cron schedule. Each case imports the task modules in a fresh interpreter, because the counts are read from
the environment when the module is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json
from collections import OrderedDict
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable
from google.protobuf.json_format import MessageToDict
import tasks.sft, tasks.rl, workflows.launch_plans as lp

settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="localhost:30000/x", tag="t")))
out = {}
for name, entity in [("sft", tasks.sft.sft), ("rl", tasks.rl.rl)]:
    t = get_serializable(OrderedDict(), settings, entity).template
    out[name] = {"type": t.type, "custom": t.custom, "image": t.container.image}
spec = get_serializable(OrderedDict(), settings, lp.nightly_retrain)
out["launch_plan"] = MessageToDict(spec.to_flyte_idl())
print("JSON" + json.dumps(out, default=str))
"""


def _serialize(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("JSON"))
    return json.loads(line[4:])


@pytest.mark.timeout(300)
def test_single_node_elastic_and_ray_worker_groups():
    out = _serialize({"POSTTRAIN_SFT_NPROC": "2", "POSTTRAIN_RAY_TRAIN_REPLICAS": "2",
                      "POSTTRAIN_RAY_ROLLOUT_REPLICAS": "1", "POSTTRAIN_RAY_SHM": "3Gi"})
    sft = out["sft"]
    # nnodes=1: a plain pod running N local processes; no training operator needed.
    assert sft["type"] == "python-task"
    assert "posttrain-cpu" in sft["image"]
    rl = out["rl"]
    assert rl["type"] == "ray"
    groups = {g["groupName"]: g["replicas"] for g in rl["custom"]["rayCluster"]["workerGroupSpec"]}
    assert groups == {"rollout": 1, "train": 2}
    # each group advertises the custom resource that placement pins its roles' bundles to
    params = {g["groupName"]: g["rayStartParams"] for g in rl["custom"]["rayCluster"]["workerGroupSpec"]}
    assert {g: json.loads(p["resources"].strip("'")) for g, p in params.items()} == {
        "rollout": {"rollout": 1000}, "train": {"train": 1000}}
    # every worker pod requests its CPUs and memory and mounts a memory-backed /dev/shm sized for the weight file
    for g in rl["custom"]["rayCluster"]["workerGroupSpec"]:
        spec = g["k8sPod"]["podSpec"]
        (c,) = spec["containers"]
        assert c["name"] == "ray-worker" and c["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
        (mount,) = c["volumeMounts"]
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert mount["mountPath"] == "/dev/shm" and vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    sched = out["launch_plan"]["spec"]["entityMetadata"]["schedule"]
    assert sched["cronSchedule"]["schedule"] == "0 3 * * *"


@pytest.mark.timeout(300)
def test_multi_node_elastic_becomes_a_pytorch_job_with_the_defined_counts():
    out = _serialize({"POSTTRAIN_SFT_NNODES": "2", "POSTTRAIN_SFT_NPROC": "4", "POSTTRAIN_RAY_TRAIN_REPLICAS": "4"})
    sft = out["sft"]
    assert sft["type"] == "pytorch"
    assert sft["custom"]["workerReplicas"]["replicas"] == 2
    assert sft["custom"]["elasticConfig"]["nprocPerNode"] == 4
    groups = {g["groupName"]: g["replicas"] for g in out["rl"]["custom"]["rayCluster"]["workerGroupSpec"]}
    assert groups["train"] == 4


@pytest.mark.timeout(300)
def test_no_rollout_worker_group_when_the_policy_ranks_generate():
    out = _serialize({"POSTTRAIN_RAY_TRAIN_REPLICAS": "2", "POSTTRAIN_RAY_ROLLOUT_REPLICAS": "0"})
    groups = {g["groupName"]: g["replicas"] for g in out["rl"]["custom"]["rayCluster"]["workerGroupSpec"]}
    assert groups == {"train": 2}  # placement.rollout_workers 0: no pods wait for rollout actors
