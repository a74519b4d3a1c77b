"""Mixed precision for every trainer (SFT and the dense objectives, the RL policy, PPO's critic): weights and
optimizer state stay fp32; with `model.dtype: bf16` on a CUDA device the forward runs under
torch.autocast(bfloat16), and on CPU everything stays fp32 (bf16 matmuls there are slower and rounder)."""

from __future__ import annotations

import torch

from posttrain.config import DType


def uses_bf16(device: torch.device, dtype: DType) -> bool:
    """Whether a trainer on `device` with `model.dtype` runs its forward in bf16."""
    return device.type == "cuda" and dtype == DType.BF16


def autocast(enabled: bool) -> torch.autocast:
    """The forward's precision context: bf16 autocast when `enabled` (see uses_bf16), else a no-op."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled)
