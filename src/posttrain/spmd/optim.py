"""The optimizer every trainer uses: AdamW over the parameters that train (all of them, or with LoRA the
adapters and any new head). With FSDP2 the parameters are shards, and so are the moments."""

from __future__ import annotations

import torch


def adamw(model: torch.nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float = 0.0,
          eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters; with `weight_decay`, matrices decay and vectors (norms, biases)
    do not (two parameter groups), else one group."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not weight_decay:
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)
