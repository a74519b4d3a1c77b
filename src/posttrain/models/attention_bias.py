"""The 4D additive attention masks we build (shared prompts, packed rows, preference pairs) in the dtype the
attention computes in.

The masks are made in fp32 on the CPU. PyTorch's SDPA accepts an fp32 mask beside bf16 queries, but its cuDNN
backend (preferred on Hopper GPUs) describes the mask to cuDNN in the queries' dtype and reads the fp32 values as
bf16: silently wrong scores (pytorch/pytorch#191612). Seen on an H200 (torch 2.11): a bf16 reference model scoring
shared-prompt rows gave a KL of 4.2 against its own fp32 policy at step 1, where padded rows gave 4e-5. Under
autocast SDPA casts the mask itself; without it the mask must arrive in the model's dtype."""

from __future__ import annotations

import torch


def attention_bias(mask: torch.Tensor, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    """`mask` (additive, 0 = attend, -inf = blocked) on `device` in the dtype `model`'s attention will see: the
    autocast dtype where autocast is on for that device, else the dtype of the model's first floating parameter
    (its input embeddings in a transformers model; works through DDP, FSDP2 and our reward-model wrapper)."""
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    else:
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return mask.to(device=device, dtype=dtype)
