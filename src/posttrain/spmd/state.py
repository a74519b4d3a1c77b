"""A trainer's model and optimizer state, saved and loaded by every rank with torch.distributed.checkpoint
(DCP: a path or an fsspec URL; each rank writes its own shard, so FSDP2 never gathers the model for it, and DDP
ranks write their part of one copy). With LoRA only the tensors that train (and their moments) are state: the
frozen base is the start model's, which every restart loads again.

The caller owns the rest of a resumable state - SFT its step, RNG and history (sft/checkpoint.py), an RL role
its version and RNG (rl/roles/spmd.py) - and the commit (a file written last)."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from posttrain.models.lora import has_adapters


def trained_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts to save or load. With LoRA the frozen base is not state: only the tensors
    that train (and their optimizer moments) - not even a tied output head, which is the frozen embedding."""
    msd, osd = get_state_dict(model, optimizer)
    if has_adapters(model):
        trained = {n.removeprefix("module.") for n, p in model.named_parameters() if p.requires_grad}
        msd = {k: v for k, v in msd.items() if k in trained}
    return msd, osd


def save_train_state(url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank calls this at once: DCP writes `url` (a folder) with each rank's part."""
    msd, osd = trained_state(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=url)


def saved_model_keys(url: str) -> set[str]:
    """The model tensors a state folder holds (from DCP's metadata; nothing else is read)."""
    if "://" in url and not url.startswith("file://"):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = FsspecReader(url)
    else:
        reader = dcp.FileSystemReader(url.removeprefix("file://"))
    return {k.removeprefix("model.") for k in reader.read_metadata().state_dict_metadata if k.startswith("model.")}


def load_train_state(url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, who: str = "") -> None:
    """Every rank calls this at once: the state `save_train_state` wrote into `url`, into this rank's model and
    optimizer (sharded as they are now). A state whose tensors are not this model's trained ones (other
    `model.lora` settings, another architecture) is refused before anything is loaded."""
    msd, osd = trained_state(model, optimizer)
    saved = saved_model_keys(url)
    if saved != set(msd):
        lora = has_adapters(model)
        raise ValueError(f"{who + ': ' if who else ''}saved state {url} holds {len(saved)} model tensors, not this "
                         f"model's {len(msd)} {'adapter ' if lora else ''}tensors"
                         + (" (was it saved with other model.lora settings?)" if lora else
                            f" (first difference: {sorted(saved ^ set(msd))[:3]})"))
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=url)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                   options=StateDictOptions(strict=not has_adapters(model)))
