"""How a model is spread over its group's ranks, and what every trainer needs to know of that spread: the
gradient sync per micro-batch, the clipped gradient norm, the full weights, and forwards that ranks run
unevenly.

An ordered list of plain calls (`wrap`): move to the rank's device -> activation checkpointing (it replaces the
decoder layers' call, so it comes before wrapping) -> DDP, or FSDP2 (`fully_shard` on every decoder layer,
then on the root).

- **DDP** (`Parallelism.DDP`): every rank holds the whole model, its gradients and its AdamW moments; gradients
  are all-reduced on the last micro-batch of a step. A world of one is not wrapped: DDP would only add its
  forward bookkeeping and a second home for the gradients (~7% of a tiny_cpu DPO step, profiled).
- **FSDP2** (`Parallelism.FSDP2`): every parameter is sharded on dim 0 over the ranks (a DTensor); each decoder
  layer is all-gathered for its forward and its backward and freed after, gradients are reduce-scattered and
  each rank steps only its shard's moments. A rank holds 1/world of the weights, gradients and moments plus one
  layer at a time. Its gathered weights equal DDP's (tests: within 1e-5 after several AdamW steps).

Every FSDP2 forward is a collective (one all-gather per layer): ranks must run the same number of them, as they
must run the same number of backward passes under DDP. Work that ranks do unevenly - a reference log-prob pass
over shards of different sizes, generation that stops when its samples end - runs inside `local_forwards`,
which gathers the whole model once on every rank, runs any number of local forwards, and frees it after.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import torch
from torch.distributed.tensor import DTensor

from posttrain.config import Parallelism
from posttrain.models.io import enable_gradient_checkpointing
from posttrain.spmd.dist import DistInfo


def _hf(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside (a reward model or critic wraps one as `.rm`: models.reward_model)."""
    return getattr(model, "rm", model)


def wrap(model: torch.nn.Module, parallelism: Parallelism, info: DistInfo, *,
         gradient_checkpointing: bool = False) -> torch.nn.Module:
    """The module the training forward runs through: `model` on the rank's device, in training mode, with
    activation checkpointing if asked, wrapped in DDP or sharded with FSDP2 (in place: `model` itself becomes
    the FSDP2 module, its parameters DTensors)."""
    model.to(info.device).train()
    hf = _hf(model)
    if gradient_checkpointing:
        enable_gradient_checkpointing(hf)
    if parallelism == Parallelism.FSDP2:
        from torch.distributed.fsdp import fully_shard

        for layer in getattr(hf, hf.base_model_prefix).layers:
            fully_shard(layer)
        return fully_shard(model)
    if info.world_size == 1:
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[info.device.index] if info.device.type == "cuda" else None, gradient_as_bucket_view=True)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` (or anything in it) is sharded by FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextlib.contextmanager
def grad_sync(net: torch.nn.Module, last: bool) -> Iterator[None]:
    """Around one micro-batch's forward and backward: gradients are reduced across ranks only on the last
    micro-batch of an optimizer step (DDP's `no_sync` before it; FSDP2 keeps unreduced gradients)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(net, FSDPModule):
        net.set_requires_gradient_sync(last)
        yield
    elif isinstance(net, torch.nn.parallel.DistributedDataParallel) and not last:
        with net.no_sync():
            yield
    else:  # the last micro-batch, or a world of one (nothing to sync)
        yield


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the gradients to `max_norm` (<= 0: no clipping) and return the norm before clipping - of the whole
    model's gradient on every rank (FSDP2's sharded norm is reduced over the group)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


class FullWeights(Mapping):
    """`model.state_dict()` with every FSDP2-sharded entry gathered when it is read (`full_tensor()`), one tensor at
    a time: what a rollout engine, a checksum or an HF folder needs, never a second full copy at once. Under
    FSDP2 each read is a collective: every rank must read the same names in the same order (sorted, or the
    state dict's own order) - so every rank of the group takes part in a weight sync, a checksum or a save."""

    def __init__(self, model: torch.nn.Module):
        self.sd = _hf_state_dict(model)

    def __getitem__(self, name: str) -> torch.Tensor:
        v = self.sd[name]
        return v.full_tensor() if isinstance(v, DTensor) else v

    def source(self, name: str) -> torch.Tensor:
        """The entry as this rank stores it (a DTensor shard under FSDP2: its global shape, no gathering) - for
        callers that only need shapes or which names share storage (tied weights)."""
        return self.sd[name]

    def __iter__(self):
        return iter(self.sd)

    def __len__(self) -> int:
        return len(self.sd)


def _hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return inner.state_dict()


@contextlib.contextmanager
def local_forwards(model: torch.nn.Module) -> Iterator[None]:
    """Forwards that ranks run unevenly (generation, a no-grad log-prob pass over shards of different sizes).
    Under FSDP2: every FSDP module is gathered once here (a collective: every rank enters this together), kept
    whole through any number of forwards, and sharded again on exit; the root keeps FSDP2's own setting (not
    resharded after forward), every layer goes back to resharding. Under DDP or one rank: nothing to do."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)

