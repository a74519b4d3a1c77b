"""The Kubernetes custom resources that Flyte's backend plugins create from our serialized cluster tasks.

    rayjob_resource(rl_template.custom, image, args=..., resources=...)      -> a RayJob (ray.io/v1), read by KubeRay
    pytorchjob_resource(sft_template.custom, image, args=..., resources=...) -> a PyTorchJob (kubeflow.org/v1), read
                                                                                by the Kubeflow training operator

A transcription of flyteplugins at flyte v1.16.8 (commit 51877f899c9f, the flyteidl/flytekit 1.16 line we pin):
`flyteplugins/go/tasks/plugins/k8s/ray/ray.go` (BuildResource, constructRayJob, buildHeadPodTemplate,
buildWorkerPodTemplate, buildSubmitterPodTemplate; defaults from ray/config.go) and
`flyteplugins/go/tasks/plugins/k8s/kfoperators/pytorch/pytorch.go` (BuildResource for task_type_version 1,
ParseElasticConfig; common/common_operator.go: ToReplicaSpecWithOverrides, ParseRunPolicy, ParseRestartPolicy).
`custom` is the task template's `custom` as flytekit serializes it (protobuf JSON names, zero values omitted),
`args` the task container's args and `resources` its flyteidl Resources as a dict ({"requests": [{"name": "CPU",
"value": "2"}], ...}). Left out, as they depend on the cluster, not the task: labels/annotations from execution
metadata and plugin config, the optional logs sidecar, tolerations for extended resources, Flyte's FLYTE_* env.
Pure functions, no flytekit: tests/integration/test_operator_crds.py validates their output against the operators'
CRDs (tests/data/crds/).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

_RESOURCE_NAMES = {"CPU": "cpu", "MEMORY": "memory", "GPU": "nvidia.com/gpu", "STORAGE": "storage",
                   "EPHEMERAL_STORAGE": "ephemeral-storage"}
_RESTART_POLICIES = {"RESTART_POLICY_NEVER": "Never", "RESTART_POLICY_ON_FAILURE": "OnFailure",
                     "RESTART_POLICY_ALWAYS": "Always"}
_CLEAN_POD_POLICIES = {"CLEANPOD_POLICY_NONE": "None", "CLEANPOD_POLICY_RUNNING": "Running",
                       "CLEANPOD_POLICY_ALL": "All"}
_RAY_PORTS = [{"name": "redis", "containerPort": 6379}, {"name": "head", "containerPort": 10001},
              {"name": "dashboard", "containerPort": 8265}]


def k8s_resources(flyte_resources: dict | None) -> dict:
    """flyteidl Resources -> a container's ResourceRequirements; a limit not given is the request (flytek8s)."""
    out = {kind: {_RESOURCE_NAMES[e["name"]]: e["value"] for e in (flyte_resources or {}).get(kind, [])}
           for kind in ("requests", "limits")}
    out["limits"] = {**out["requests"], **out["limits"]}
    return {k: v for k, v in out.items() if v}


def _task_pod(container: str, image: str, args: Sequence[str], resources: dict | None) -> dict:
    """The task's own pod spec (flytek8s.ToK8sPodSpec), its primary container named `container`."""
    return {"containers": [{"name": container, "image": image, "args": list(args),
                            "resources": k8s_resources(resources)}], "restartPolicy": "Never"}


def _merge(base, overlay):
    """mergo.Merge(WithOverride, WithAppendSlice): maps merge, lists append, overlay scalars win."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        return {**base, **{k: _merge(base[k], v) if k in base else v for k, v in overlay.items()}}
    if isinstance(base, list) and isinstance(overlay, list):
        return base + overlay
    return overlay


def _merge_pod_spec(base: dict, k8s_pod: dict | None) -> dict:
    """flytek8s.MergeOverlayPodSpecOntoBase: the group's k8sPod podSpec over the task's; containers merge by name,
    and only the base's containers are kept."""
    overlay = (k8s_pod or {}).get("podSpec")
    if not overlay:
        return base
    merged = _merge({k: v for k, v in base.items() if k != "containers"},
                    {k: v for k, v in overlay.items() if k != "containers"})
    by_name = {c["name"]: c for c in overlay.get("containers", [])}
    merged["containers"] = [_merge(c, by_name[c["name"]]) if c["name"] in by_name else c for c in base["containers"]]
    return merged


def _ray_pod_template(task_pod: dict, role: str, group: dict) -> dict:
    """buildHeadPodTemplate / buildWorkerPodTemplate: the primary container renamed ray-head/ray-worker, its args
    dropped, Ray's env and ports added, then the group's own pod spec merged over it."""
    pod = copy.deepcopy(task_pod)
    c = pod["containers"][0]
    c.update(name=f"ray-{role}", args=[], ports=copy.deepcopy(_RAY_PORTS))
    pod_ip = {"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    if role == "head":
        c["env"] = [pod_ip]
    else:
        def ref(name, res):
            return {"name": name, "valueFrom": {"resourceFieldRef": {"containerName": "ray-worker", "resource": res}}}
        c["env"] = [{"name": "RAY_DISABLE_DOCKER_CPU_WARNING", "value": "1"}, {"name": "TYPE", "value": "worker"},
                    ref("CPU_REQUEST", "requests.cpu"), ref("CPU_LIMITS", "limits.cpu"),
                    ref("MEMORY_REQUESTS", "requests.cpu"), ref("MEMORY_LIMITS", "limits.cpu"),  # sic, as ray.go
                    {"name": "MY_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, pod_ip]
        c["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}}
    meta = (group.get("k8sPod") or {}).get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
            "spec": _merge_pod_spec(pod, group.get("k8sPod"))}


def rayjob_resource(custom: dict, image: str, name: str = "rl", *, args: Sequence[str] = (),
                    resources: dict | None = None) -> dict:
    """The RayJob that ray.go's BuildResource creates for a `ray` task, with the plugin's default config."""
    cluster = custom.get("rayCluster", {})
    task_pod = _task_pod(name, image, args, resources)
    head = cluster.get("headGroupSpec", {})
    head_params = {"include-dashboard": "true", "node-ip-address": "$MY_POD_IP", "dashboard-host": "0.0.0.0",
                   "disable-usage-stats": "true", **head.get("rayStartParams", {})}
    workers = []
    for g in cluster.get("workerGroupSpec", []):
        replicas = g.get("replicas", 0)
        params = {"node-ip-address": "$MY_POD_IP", "disable-usage-stats": "true", **g.get("rayStartParams", {})}
        workers.append({"groupName": g.get("groupName", ""), "replicas": replicas,
                        "minReplicas": min(g.get("minReplicas", 0), replicas),
                        "maxReplicas": max(g.get("maxReplicas", 0), replicas),
                        "rayStartParams": params, "template": _ray_pod_template(task_pod, "worker", g)})
    spec = {
        "rayClusterSpec": {
            "headGroupSpec": {"template": _ray_pod_template(task_pod, "head", head), "serviceType": "NodePort",
                              "enableIngress": False, "rayStartParams": head_params},
            "workerGroupSpecs": workers,
            "enableInTreeAutoscaling": bool(cluster.get("enableAutoscaling", False)),
        },
        "entrypoint": " ".join(a if a else "''" for a in args),
        # the task's own setting when it asks for shutdown, else the plugin config's (true, 3600 s)
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": custom.get("ttlSecondsAfterFinished", 0)
        if custom.get("shutdownAfterJobFinishes") else 3600,
        "submitterPodTemplate": {"metadata": {}, "spec": copy.deepcopy(task_pod)},
    }
    if custom.get("runtimeEnvYaml"):  # (ray.go converts the deprecated base64 runtimeEnv only when this is absent)
        spec["runtimeEnvYAML"] = custom["runtimeEnvYaml"]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name}, "spec": spec}


def _replica_spec(task_pod: dict, replicas: dict, master: bool) -> dict:
    """common.ToReplicaSpecWithOverrides: the task pod with the replica's image/resources/command overrides."""
    rs = replicas.get("common") or replicas
    pod = copy.deepcopy(task_pod)
    c = pod["containers"][0]
    c["image"] = rs.get("image") or c["image"]
    if rs.get("resources", {}).get("requests") or rs.get("resources", {}).get("limits"):
        c["resources"] = k8s_resources(rs["resources"])
    if replicas.get("command"):
        c["args"] = list(replicas["command"])
    if not master:
        c["env"] = [{"name": "_F_WN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {"replicas": 1 if master else rs.get("replicas", 0), "template": {"metadata": {}, "spec": pod},
            "restartPolicy": _RESTART_POLICIES[rs.get("restartPolicy", "RESTART_POLICY_NEVER")]}


def pytorchjob_resource(custom: dict, image: str, name: str = "sft", *, args: Sequence[str] = (),
                        resources: dict | None = None) -> dict:
    """The PyTorchJob that pytorch.go's BuildResource creates for a `pytorch` task of task_type_version 1 (what
    flytekitplugins-kfpytorch's PyTorch and Elastic configs serialize to)."""
    task_pod = _task_pod("pytorch", image, args, resources)
    specs = {"Master": _replica_spec(task_pod, custom.get("masterReplicas", {}), master=True)}
    worker = _replica_spec(task_pod, custom.get("workerReplicas", {}), master=False)
    if worker["replicas"] > 0:
        specs["Worker"] = worker
    run_policy = {}
    if "runPolicy" in custom:
        rp = custom["runPolicy"]
        run_policy["cleanPodPolicy"] = _CLEAN_POD_POLICIES[rp.get("cleanPodPolicy", "CLEANPOD_POLICY_NONE")]
        run_policy.update({k: int(rp[k]) for k in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished")
                           if rp.get(k)})
    spec = {"pytorchReplicaSpecs": specs, "runPolicy": run_policy}
    if "elasticConfig" in custom:
        ec = custom["elasticConfig"]
        spec["elasticPolicy"] = {"minReplicas": ec.get("minReplicas", 0), "maxReplicas": ec.get("maxReplicas", 0),
                                 "rdzvBackend": ec.get("rdzvBackend", ""), "nProcPerNode": ec.get("nprocPerNode", 0),
                                 "maxRestarts": ec.get("maxRestarts", 0)}
        del specs["Master"]  # elastic: workers only, torchrun rendezvous instead of a master
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name}, "spec": spec}
