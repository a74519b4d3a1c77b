"""Distributed state as a small tuple, and process-group set-up from the torchelastic environment.

Elastic (and torchrun) set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Without them (a plain
`python` call) we start a world of one, so the same code path - including collectives - runs everywhere.

Devices and backend: with CUDA every rank computes on GPU `local_rank % device_count`. NCCL is used only
when each rank of the node has a GPU of its own (LOCAL_WORLD_SIZE <= device_count): NCCL refuses two ranks
on one GPU (ncclInvalidUsage), so ranks that share a GPU talk over gloo (Backend.AUTO), and asking for NCCL
there is an error. Without CUDA: gloo on CPU.
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


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x
