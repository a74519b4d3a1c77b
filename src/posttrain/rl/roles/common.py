"""What every role worker shares: its identity and its torch thread count (workers share the node's cores)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
from functools import lru_cache

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


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library is not glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def return_free_memory() -> bool:
    """Give the C allocator's free pages back to the OS (glibc `malloc_trim(0)`); False where there is none.

    Tensors under glibc's mmap threshold (at most 32 MB: activations, per-layer gradients, optimizer
    temporaries) come from malloc's heaps, and freed ones stay there as RSS that only this process can reuse.
    A policy rank calls it after each update: on SmolLM2-135M it then rests at 1.86 GiB between updates
    instead of 2.3-2.7 (bench/rl_memory.py), memory the rollout can use while the policy waits."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
