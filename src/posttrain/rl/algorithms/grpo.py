"""GRPO as pure tensor functions: group-normalised advantages, a clipped importance-ratio policy loss with an
optional KL penalty to a reference model (k1/k2/k3 estimators), and token- or sequence-mean aggregation.

SPMD normalisation: when a batch is split over ranks and micro-batches, pass `normalizer` = the GLOBAL
number of response tokens (TOKEN_MEAN), sequences (SEQ_MEAN) or sequences x the constant horizon
(SEQ_MEAN_TOKEN_SUM_NORM, `normalizer(...)`). Each shard then returns sum / normalizer, so the shards' losses -
and gradients - add up exactly to the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.config import KLEstimator, LossAgg


def group_advantages(rewards: torch.Tensor, group_size: int, *, std_normalize: bool, eps: float = 1e-6) -> torch.Tensor:
    """(B,) rewards, grouped consecutively (B = groups * group_size) -> (B,) advantages.

    A_i = r_i - mean(group)            and, if std_normalize, divided by (std(group) + eps) with the unbiased
    (n - 1) std, as in the GRPO paper's implementations. A group whose rewards are all equal gets 0.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)  # (G, n)
    adv = r - r.mean(dim=1, keepdim=True)
    if std_normalize:
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    return adv.view(-1)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi. With d = logp - ref_logp:
    k1 = d;  k2 = d^2 / 2;  k3 = exp(-d) - 1 + d  (Schulman: unbiased and never negative)."""
    d = logp - ref_logp
    if estimator == KLEstimator.K1:
        return d
    if estimator == KLEstimator.K2:
        return 0.5 * d * d
    return torch.exp(-d) - 1 + d


@dataclass(frozen=True)
class PolicyLossStats:
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    tokens: int
    clip_fraction_lower: float = 0.0  # share of valid tokens where dual-clip's -A * clip_ratio_c bound applied


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                clip_low: float, clip_high: float, loss_agg: LossAgg, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, kl_estimator: KLEstimator = KLEstimator.K3,
                normalizer: float | None = None,
                clip_ratio_c: float | None = None,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, PolicyLossStats]:
    """logp, old_logp, mask, ref_logp: (B, T); advantages: (B,) one per sequence, or (B, T) one per token (PPO).
    Returns (scalar loss, stats).

    per token:  -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) + kl_coef * KL,   r = exp(logp - old_logp)
    dual-clip (clip_ratio_c given, > 1; Ye et al. 2019, verl's clip_ratio_c): where A < 0 the policy term is
                min(that, -A * clip_ratio_c), which bounds the loss of a token whose ratio has run far above 1.
    weights (B, T): each token's policy term is multiplied by it (the mismatch correction's truncated importance
                ratios, verl's rollout_is_weights); the KL term is not.
    No clamp of logp - old_logp before exp (verl clamps it to [-20, 20]).
    Aggregation: `aggregate`.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    mask = mask.float()
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None].float() if advantages.dim() == 1 else advantages.float()  # (B, 1) or (B, T)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    pg = -torch.minimum(unclipped, clipped)  # (B, T)
    lower = None
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c
        lower = ((pg > bound) & (adv < 0)).float()
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    if weights is not None:
        pg = pg * weights
    per_token = pg
    kl = torch.zeros_like(pg)
    if ref_logp is not None and kl_coef > 0:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = pg + kl_coef * kl
    loss = aggregate(per_token, mask, loss_agg, normalizer)
    clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
    return loss, loss_stats(pg, kl, clipped, ratio, mask, lower)


@torch.no_grad()
def loss_stats(pg: torch.Tensor, kl: torch.Tensor, clipped: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor,
               lower: torch.Tensor | None = None) -> PolicyLossStats:
    """A policy loss's statistics, each a mean over the valid tokens: the policy term, the KL, the share of
    clipped tokens (and of dual-clipped ones, `lower`), the ratio."""
    n = float(mask.sum().clamp(min=1))

    def mean(x: torch.Tensor) -> float:
        return float((x.float() * mask).sum() / n)

    return PolicyLossStats(pg_loss=mean(pg), kl=mean(kl), clip_fraction=mean(clipped), ratio_mean=mean(ratio),
                           tokens=int(mask.sum()), clip_fraction_lower=mean(lower) if lower is not None else 0.0)


def normalizer(loss_agg: LossAgg, *, tokens: int, sequences: int, horizon: int) -> float:
    """The GLOBAL normaliser of `aggregate` for a batch of `tokens` valid tokens in `sequences` sequences;
    `horizon`: the constant token normaliser of SEQ_MEAN_TOKEN_SUM_NORM (rl.max_new_tokens)."""
    if loss_agg == LossAgg.TOKEN_MEAN:
        return float(tokens)
    if loss_agg == LossAgg.SEQ_MEAN:
        return float(sequences)
    return float(sequences * horizon)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg,
              normalizer: float | None = None) -> torch.Tensor:
    """(B, T) per-token losses -> scalar (verl's agg_loss):
    TOKEN_MEAN:              sum over valid tokens / normalizer (default: this batch's token count)
    SEQ_MEAN:                sum over sequences of (sequence's token mean) / normalizer (default: sequences)
    SEQ_MEAN_TOKEN_SUM_NORM: sum over sequences of (sequence's token SUM) / normalizer (default: sequences x T)
                             - Dr. GRPO's constant normaliser: a long answer's tokens weigh what a short one's do
    """
    mask = mask.float()
    if loss_agg == LossAgg.TOKEN_MEAN:
        norm = normalizer if normalizer is not None else float(mask.sum().clamp(min=1))
        return (per_token * mask).sum() / norm
    if loss_agg == LossAgg.SEQ_MEAN:
        norm = normalizer if normalizer is not None else float(mask.shape[0])
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm
    norm = normalizer if normalizer is not None else float(mask.shape[0] * mask.shape[1])
    return (per_token * mask).sum() / norm
