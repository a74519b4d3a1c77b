"""Rollout/trainer mismatch: the rollout engine samples from q (vLLM in bf16, another kernel, a stale copy) while
the trainer's policy is p. Even at one version, log q and log p differ, and the difference grows into the
best-known silent collapse of 2025-26 RL. The correction, as verl's rollout correction and TIS do it (Yao et al.
2025, "Your efficient RL framework secretly brings you off-policy RL training"):

- the importance ratio's "old" log-probs are the trainer's own at the rollout's version, log p_old, not log q;
- each token's policy term is weighted by the truncated importance ratio p_old / q, which corrects for
  sampling from q:
    token_tis     w_t = min(p_old(y_t) / q(y_t), cap)
    sequence_tis  w_t = min(prod_t p_old(y_t) / q(y_t), cap), one weight for every token of the sequence
    token_mask    w_t = 1 where 1/cap <= p_old(y_t) / q(y_t) <= cap, else 0 (the token is left out)

`mismatch_stats` measures the gap every step: KL(q || p_old) by the k3 estimator on q's samples, which is never
negative, and the largest |log p_old - log q| over the batch.
"""

from __future__ import annotations

import torch

from posttrain.config import MismatchCorrection


def mismatch_weights(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                     mode: MismatchCorrection, cap: float) -> torch.Tensor:
    """(B, T) per-token weights of the policy term (0 off the mask)."""
    m = mask.float()
    log_ratio = (trainer_logp - rollout_logp) * m
    if mode == MismatchCorrection.TOKEN_TIS:
        w = torch.clamp(torch.exp(log_ratio), max=cap)
    elif mode == MismatchCorrection.SEQUENCE_TIS:
        w = torch.clamp(torch.exp(log_ratio.sum(1, keepdim=True)), max=cap).expand_as(log_ratio)
    elif mode == MismatchCorrection.TOKEN_MASK:
        r = torch.exp(log_ratio)
        w = ((r <= cap) & (r >= 1.0 / cap)).float()
    else:
        raise ValueError(f"no weights for mismatch correction {mode}")
    return w * m


def mismatch_stats(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """(sum over valid tokens of the k3 estimate of KL(q || p), max |log p - log q|, valid tokens)."""
    m = mask.bool()
    d = (trainer_logp - rollout_logp)[m]  # log p - log q on q's samples
    if d.numel() == 0:
        return 0.0, 0.0, 0
    k3 = torch.exp(d) - 1 - d
    return float(k3.sum()), float(d.abs().max()), int(d.numel())
