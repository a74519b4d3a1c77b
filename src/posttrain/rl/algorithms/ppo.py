"""PPO's tensor math beyond GRPO's: token-level rewards with a KL penalty, GAE advantages and returns, the
clipped value loss and the value head's explained variance. The policy loss is `grpo.policy_loss` (token-level
advantages (B, T) and dual-clip via `clip_ratio_c`). Each function equals verl 0.9.1's on the same inputs.

Token rewards (verl's reward manager + `apply_kl_penalty`): the sequence's outcome score sits on its last valid
token; with a KL estimate kl_t (e.g. k1 = old_logp - ref_logp) every valid token also gets -kl_coef * kl_t.

GAE (verl's `compute_gae_advantage_return`), a backward recursion over positions t = T-1 .. 0:
    delta_t = r_t + gamma * V_next - V_t
    A_t     = delta_t + gamma * lam * A_next
    V_next, A_next <- V_t, A_t                  on valid tokens only
A masked position (padding, or an observation/tool token inside a multi-turn response) does not update V_next
or A_next: the recursion steps over it, as if it were not there, and its own A_t is the carried A_next (0 after
a sequence's last valid token). returns = A + V (before whitening, at every position), then the advantages are
whitened, (A - mean) / sqrt(var + 1e-8), with the mean and the unbiased variance taken over the valid tokens of
the WHOLE batch and the result applied at every position (masked positions too: mask the advantages when you
use them). Whitening is a batch statistic: call this on the whole batch, not on an SPMD shard.

Value loss (verl's `compute_value_loss`), per valid token with V = new values, V_old = the rollout's values:
    0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)
token-mean over the valid tokens. SPMD normalisation as in grpo.py: pass `normalizer` = the GLOBAL number of
valid tokens, each shard returns sum / normalizer and the shards' losses and gradients add up to the whole
batch's.

Explained variance (verl's `critic/vf_explained_var` metric): 1 - Var[R - V] / (Var[R] + eps) over the valid
tokens, unbiased variances.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WHITEN_EPS = 1e-8  # verl's masked_whiten / masked_mean


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, *, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """scores: (B,) outcome scores; mask: (B, T) valid response tokens; kl: (B, T) per-token KL estimate or None.
    Returns (B, T) token rewards: scores[i] on row i's last valid token, minus kl_coef * kl on every valid token
    when kl is given; 0 off the mask. A row with no valid token gets no reward."""
    valid = mask.bool()
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    if kl is not None:
        dtype = torch.promote_types(dtype, kl.dtype)
    out = torch.zeros(mask.shape, dtype=dtype, device=scores.device)
    pos = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(valid, pos, -1).amax(dim=1)  # (B,) index of the last valid token, -1 if none
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = scores[rows].to(dtype)
    if kl is not None:
        out = out - kl_coef * torch.where(valid, kl.to(dtype), 0.0)
    return out


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, 0.0).sum() / (mask.sum() + WHITEN_EPS)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) at every position, the mean and unbiased variance over mask's valid entries
    (verl's masked_whiten). Needs at least two valid entries."""
    n = float(mask.sum())
    if n < 2:
        raise ValueError(f"whitening needs at least 2 valid tokens, got {n:g}")
    mask = mask.to(x.dtype)
    mean = _masked_mean(x, mask)
    var = _masked_mean((x - mean) ** 2, mask) * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS)


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, values, mask: (B, T). Returns (advantages, returns), both (B, T): GAE(gamma, lam) with masked
    positions stepped over, returns = raw advantages + values, advantages whitened over the batch's valid tokens
    (see the module docstring for the values at masked positions)."""
    advantages = _gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    return masked_whiten(advantages, mask.to(values.dtype)), advantages + values.detach()


def gae_returns(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
                lam: float) -> torch.Tensor:
    """(B, T) the returns of `gae_advantages` alone: raw GAE + values, row by row (no batch statistic), so an SPMD
    critic rank can compute its own shard's regression targets."""
    return _gae(token_rewards, values, mask, gamma=gamma, lam=lam) + values.detach()


def _gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
         lam: float) -> torch.Tensor:
    """(B, T) raw (unwhitened) GAE advantages, the backward recursion of the module docstring."""
    with torch.no_grad():
        values = values.detach()
        m = mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_rewards.shape[1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
            last_gae = gae * m[:, t] + (1 - m[:, t]) * last_gae
            reversed_adv.append(last_gae)
        return torch.stack(reversed_adv[::-1], dim=1)


@dataclass(frozen=True)
class ValueLossStats:
    vf_loss: float  # this batch's token-mean of the clipped loss (whatever the normalizer)
    clip_fraction: float  # share of valid tokens where the clipped term was the larger
    values_mean: float
    tokens: int


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               clip_range: float, normalizer: float | None = None) -> tuple[torch.Tensor, ValueLossStats]:
    """values (new predictions), old_values (the rollout's), returns, mask: (B, T). Returns (scalar loss, stats).

    per token: 0.5 * max((V - R)^2, (clip(V, V_old - clip_range, V_old + clip_range) - R)^2)
    loss: sum over valid tokens / normalizer (default: this batch's valid-token count, i.e. a token mean)."""
    valid = mask.bool()
    clipped = torch.maximum(torch.minimum(values, old_values + clip_range), old_values - clip_range)
    loss1 = (values - returns) ** 2
    loss2 = (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(loss1, loss2)
    total = torch.where(valid, per_token, 0.0).sum()
    n = float(valid.sum())
    loss = total / (normalizer if normalizer is not None else max(n, 1.0))
    with torch.no_grad():
        d = max(n, 1.0)
        stats = ValueLossStats(vf_loss=float(total) / d, clip_fraction=float((valid & (loss2 > loss1)).sum()) / d,
                               values_mean=float(torch.where(valid, values, 0.0).sum()) / d, tokens=int(n))
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
                       eps: float = 1e-5) -> float:
    """values, returns, mask: (B, T) -> 1 - Var[R - V] / (Var[R] + eps) over the valid tokens (unbiased
    variances, as verl's critic/vf_explained_var). 1 is a perfect value head, 0 no better than a constant; NaN
    with fewer than two valid tokens."""
    valid = mask.bool()
    if int(valid.sum()) < 2:
        return float("nan")
    v, r = values[valid], returns[valid]
    return float(1.0 - torch.var(r - v) / (torch.var(r) + eps))
