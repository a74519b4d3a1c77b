"""What every role worker shares: its identity and its torch thread count (workers share the node's cores)."""

from __future__ import annotations

import os
import socket

import torch

from posttrain.rl.types import WorkerId


def worker_identity(role: str, rank: int, world_size: int) -> WorkerId:
    node = socket.gethostname()
    try:
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()[:12]
    except ImportError:
        pass
    return WorkerId(role=role, rank=rank, world_size=world_size, node=node, pid=os.getpid())


def set_torch_threads(threads: int = 1) -> None:
    """torch intra-op threads for this worker: 1 unless placement.torch_threads (policy ranks) or
    placement.generation_threads (rollout and reference workers) say otherwise."""
    torch.set_num_threads(max(1, int(threads)))


def where() -> dict:
    """Where this worker runs: node, placement group and the (bundle-indexed) resources Ray assigned it."""
    import ray

    ctx = ray.get_runtime_context()
    return {"node": ctx.get_node_id(), "placement_group": ctx.get_placement_group_id(),
            "resources": ctx.get_assigned_resources()}
