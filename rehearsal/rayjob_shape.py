"""The pods a RayJobConfig declares, one Ray node each, as KubeRay starts them.

    pods(tasks.rl.ray_config)  ->  [Pod("head", ...), Pod("rollout-0", ...), Pod("train-0", ...), Pod("train-1", ...)]

KubeRay gives each pod's `ray start` the group's `ray_start_params` and, unless they say otherwise, the pod's
CPU request as `--num-cpus` and its memory request as `--memory`. The placement plan reads these shapes (a
plan that cannot fit them fails before anything starts: tests/unit/test_placement_pods.py), and the cluster
rehearsal (`local_cluster`: tests/cluster/, bench/rl.py --sections cluster) starts one local Ray node per pod.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
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


def add_node(cluster, pod: Pod):
    """Start `pod` as a Ray node of a `ray.cluster_utils.Cluster`: its CPUs, memory and custom resources."""
    return cluster.add_node(num_cpus=pod.num_cpus, resources=pod.resources, memory=pod.memory_bytes or None,
                            object_store_memory=200 * 2**20)


@contextmanager
def local_cluster(config, *, env_vars: dict[str, str] | None = None):
    """A rehearsal of the RayJob on this machine: one local Ray node per pod of `config` (the head with its
    `num-cpus`, each worker group's replicas with their CPUs, memory and group resource), this process connected
    to it as the job's driver is. Yields (cluster, {pod name: (Pod, Ray node)}); the cluster is torn down at the
    end, whatever happens - while it runs, every bare `ray.init()` on the machine joins it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("local_cluster: this process is already connected to Ray; the rehearsal needs its own")
    shape = pods(config)
    head, workers = shape[0], shape[1:]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head.num_cpus, "resources": head.resources,
                                                            "include_dashboard": False})
    try:
        nodes = {p.name: (p, add_node(cluster, p)) for p in workers}
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                           **(env_vars or {})}})
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
