"""The pods a RayJobConfig declares, one Ray node each, as KubeRay starts them.

    pods(tasks.rl.ray_config)  ->  [Pod("head", ...), Pod("rollout-0", ...), Pod("train-0", ...), Pod("train-1", ...)]

KubeRay gives each pod's `ray start` the group's `ray_start_params` and, unless they say otherwise, the pod's
CPU request as `--num-cpus` and its memory request as `--memory`. The placement plan reads these shapes (a
plan that cannot fit them fails before anything starts: tests/unit/test_placement_pods.py), and the cluster
rehearsal (tests/cluster/) starts one local Ray node per pod from them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from posttrain.rl.placement import Node

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True, kw_only=True)
class Pod:
    name: str
    """"head", or "<group>-<replica>"."""
    group: str
    """"head" or the worker group's name."""
    num_cpus: float
    memory_bytes: int
    resources: dict[str, float] = field(default_factory=dict)
    """Custom resources its `ray start` advertises (the worker group's, from ray_start_params)."""

    def node(self) -> Node:
        return Node(name=self.name, resources={"CPU": self.num_cpus, "memory": float(self.memory_bytes),
                                               **self.resources})


def cpu_quantity(q: str) -> float:
    """A Kubernetes CPU quantity ("2", "500m", "1.5") in cores."""
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def memory_quantity(q: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "512Mi", "2G", "1000") in bytes."""
    m = re.fullmatch(r"([0-9.]+)([kMGT]i?)?", q)
    if not m:
        raise ValueError(f"not a Kubernetes memory quantity: {q!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _requests(node_config):
    """The pod's resource requests: the config's own, or those of its pod template's primary container."""
    if node_config.requests is not None or node_config.pod_template is None:
        return node_config.requests
    from flytekit import Resources

    tpl = node_config.pod_template
    c = next(c for c in tpl.pod_spec.containers if c.name == tpl.primary_container_name)
    req = (c.resources.requests if c.resources else None) or {}
    return Resources(cpu=req.get("cpu"), mem=req.get("memory"))


def shm_bytes(node_config) -> int | None:
    """Size of the memory-backed /dev/shm its pod template mounts (None: the container runtime's default)."""
    tpl = node_config.pod_template
    if tpl is None:
        return None
    c = next(c for c in tpl.pod_spec.containers if c.name == tpl.primary_container_name)
    mounted = {m.name for m in c.volume_mounts or [] if m.mount_path == "/dev/shm"}
    for v in tpl.pod_spec.volumes or []:
        if v.name in mounted and v.empty_dir is not None and v.empty_dir.medium == "Memory":
            return memory_quantity(v.empty_dir.size_limit) if v.empty_dir.size_limit else None
    return None


def _pod(name: str, group: str, start_params: dict[str, str] | None, requests) -> Pod:
    params = dict(start_params or {})
    if "num-cpus" in params:
        cpus = float(params["num-cpus"])
    elif requests is not None and requests.cpu:
        cpus = cpu_quantity(str(requests.cpu))
    else:
        raise ValueError(f"RayJob pod {name}: neither ray_start_params num-cpus nor a CPU request")
    mem = memory_quantity(str(requests.mem)) if requests is not None and requests.mem else 0
    raw = params.get("resources", "{}").strip()
    if raw[:1] in "'\"" and raw[-1:] == raw[:1]:  # a quoted JSON string, as `ray start --resources` takes it
        raw = raw[1:-1]
    resources = json.loads(raw)
    return Pod(name=name, group=group, num_cpus=cpus, memory_bytes=mem,
               resources={k: float(v) for k, v in resources.items()})


def pods(config) -> list[Pod]:
    """Every pod of a flytekitplugins.ray RayJobConfig: the head, then each worker group's replicas."""
    head = config.head_node_config
    out = [_pod("head", "head", head.ray_start_params if head else None, _requests(head) if head else None)]
    for g in config.worker_node_config:
        out += [_pod(f"{g.group_name}-{i}", g.group_name, g.ray_start_params, _requests(g)) for i in range(g.replicas)]
    return out
