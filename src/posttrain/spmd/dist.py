"""Distributed state as a small tuple, and process-group set-up: from the torchelastic environment (the dense
trainer under Elastic or torchrun) or from an address the controller hands every rank (the RL policy and critic,
whose ranks are Ray actors).

Elastic (and torchrun) set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Without them (a plain
`python` call) we start a world of one, so the same code path - including collectives - runs everywhere.

Devices and backend: with CUDA every rank computes on GPU `local_rank % device_count`. NCCL is used only
when each rank of the node has a GPU of its own (LOCAL_WORLD_SIZE <= device_count): NCCL refuses two ranks
on one GPU (ncclInvalidUsage), so ranks that share a GPU talk over gloo (Backend.AUTO), and asking for NCCL
there is an error. Without CUDA: gloo on CPU. Actor ranks choose the same way from their GPUs' UUIDs
(`choose_backend`).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from posttrain.config import Backend


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: Backend = Backend.AUTO, timeout_s: float = 600) -> DistInfo:
    """Join the group the launcher (Elastic, torchrun) describes in the environment; a world of one without it."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = torch.cuda.is_available()
    own_gpu = cuda and local_world <= torch.cuda.device_count()
    name = {Backend.AUTO: "nccl" if own_gpu else "gloo", Backend.GLOO: "gloo", Backend.NCCL: "nccl"}[backend]
    if name == "nccl" and not own_gpu:
        raise RuntimeError("sft.backend: 'nccl' needs one GPU per rank " + (
            f"({local_world} ranks per node share {torch.cuda.device_count()} GPU(s))" if cuda else "(no CUDA here)")
            + "; use 'gloo' (or 'auto')")
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(name, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world, device=device)


def join_group(addr: str, port: int, *, rank: int, world_size: int, device: torch.device, backend: str,
               timeout_s: float) -> DistInfo:
    """Join a group at `tcp://addr:port` (every rank calls this at once; it blocks until all have joined): for
    ranks that are not started by a launcher - the RL roles' Ray actors, each role its own processes and so its
    own default group. `backend` comes from `choose_backend` over every rank's device."""
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank=rank, local_rank=device.index or 0, world_size=world_size, device=device)


def choose_backend(device_keys: list[str]) -> str:
    """NCCL only when every rank is on a GPU of its own (distinct GPU UUIDs, `device_key`); gloo otherwise - NCCL
    refuses two ranks on one GPU, and CPU ranks need gloo."""
    if all(k != "cpu" for k in device_keys) and len(set(device_keys)) == len(device_keys):
        return "nccl"
    return "gloo"


def device_key(device: torch.device) -> str:
    """"cpu", or the UUID of `device` (ranks on different nodes see different UUIDs; ranks sharing a GPU the same)."""
    if device.type != "cuda":
        return "cpu"
    return str(torch.cuda.get_device_properties(device).uuid)


def node_address() -> tuple[str, int]:
    """This node's address (as Ray knows it, so ranks on other nodes can reach it) and a free port on it."""
    host = "127.0.0.1"
    try:
        import ray

        if ray.is_initialized():
            host = ray.util.get_node_ip_address()
    except ImportError:
        pass
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def group_mean(total: float, count: float, device: torch.device) -> float:
    """sum(total) / sum(count) over the group's ranks (a world of one, or no group: total / count)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = all_reduce_sum(torch.tensor([total, count], dtype=torch.float64, device=device))
        total, count = float(t[0]), float(t[1])
    return total / max(count, 1.0)
