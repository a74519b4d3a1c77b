"""The policy-gradient family beside GRPO, as pure tensor functions. Each equals verl 0.9.1's on fixed inputs
within 1e-6 (tests/unit/test_pg_family_verl.py).

- `rloo_advantages`: the leave-one-out baseline (Ahmadian et al. 2024). Within a prompt's group of n samples,
  A_i = r_i - mean_{j != i} r_j = n / (n - 1) x (r_i - mean(group)). The estimate is unbiased, and there is no
  std scaling.
- Dr. GRPO (Liu et al. 2025) is `grpo.group_advantages(std_normalize=False)` with
  `LossAgg.SEQ_MEAN_TOKEN_SUM_NORM` (`grpo.aggregate`). It removes the two length and difficulty biases of
  GRPO's normalisations; it has no function of its own.
- `reinforce_pp_returns`: REINFORCE++ (Hu 2025). Token rewards are the outcome on the last token, plus the KL
  penalty when there is a reference (`ppo.token_rewards`). The discounted returns R_t = r_t + gamma R_{t+1}
  are the advantages, whitened over the batch's valid tokens. The baseline is the batch's, not the group's.
- `gspo_loss`: GSPO (Zheng et al. 2025), a sequence-level importance ratio. It is the geometric mean of the
  sequence's token ratios, s_i = exp(mean_t(log pi - log pi_old)), clipped as a whole. Its gradient reaches
  every token through s_i,t = sg[s_i] x pi_t / sg[pi_t]. Its clip ranges are ~1e-3 (the paper: 3e-4 and 4e-4),
  not PPO's 0.2.
- `overlong_penalty`: DAPO's soft overlong punishment (Yu et al. 2025). A response longer than
  `max_len - buffer` tokens loses up to `factor`, linearly over the buffer's last `buffer` tokens.
"""

from __future__ import annotations

import torch

from posttrain.config import KLEstimator, LossAgg
from posttrain.rl.algorithms.grpo import PolicyLossStats, aggregate, kl_penalty, loss_stats
from posttrain.rl.algorithms.ppo import masked_whiten

GSPO_LOG_RATIO_MAX = 10.0  # verl clamps log s_i,t at 10 before exp (numerical safety)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) rewards, grouped consecutively -> (B,) leave-one-out advantages. A group of one gets its reward
    unchanged, as verl does: there is no other sample to compare it with."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)  # (G, n)
    if group_size == 1:
        return r.view(-1).clone()
    n = group_size
    return (r * n / (n - 1) - r.mean(dim=1, keepdim=True) * n / (n - 1)).view(-1)


def reinforce_pp_returns(token_rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """(B, T) token rewards and response mask -> (B, T) REINFORCE++ advantages: the discounted returns, whitened
    over the batch's valid tokens (zero at masked positions). A masked position inside a response carries the
    running return through unchanged, as verl's recursion does."""
    m = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        new = token_rewards[:, t] + gamma * running
        returns[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return masked_whiten(returns, m) * m


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              clip_low: float, clip_high: float, loss_agg: LossAgg = LossAgg.SEQ_MEAN,
              ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: KLEstimator = KLEstimator.K3,
              normalizer: float | None = None, weights: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, PolicyLossStats]:
    """The GSPO objective. logp, old_logp, mask, ref_logp: (B, T); advantages: (B,) one per sequence, or (B, T).
    Returns (scalar loss, stats).

    log s_i   = sum_t mask x (logp - old_logp) / |y_i|                       (sequence-level, length-normalised)
    log s_i,t = min(logp_t - sg[logp_t] + sg[log s_i], 10)                   (value s_i, gradient through logp_t)
    per token: max(-A s_i,t, -A clip(s_i,t, 1 - clip_low, 1 + clip_high)) + kl_coef x KL_t
    aggregated by `grpo.aggregate` (SEQ_MEAN: the paper's sequence mean of token means).
    clip_fraction: the share of valid tokens whose clipped term is the larger (verl's pg_clipfrac).
    """
    mask = mask.float()
    adv = advantages[:, None].float() if advantages.dim() == 1 else advantages.float()
    lengths = mask.sum(1).clamp(min=1)
    log_seq = ((logp - old_logp) * mask).sum(1) / lengths  # (B,)
    log_ratio = torch.clamp(logp - logp.detach() + log_seq.detach()[:, None], max=GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(log_ratio)  # (B, T): s_i in value at every token
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    if weights is not None:  # the mismatch correction's per-token weights (verl's rollout_is_weights)
        pg = pg * weights
    per_token, kl = pg, torch.zeros_like(pg)
    if ref_logp is not None and kl_coef > 0:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = pg + kl_coef * kl
    loss = aggregate(per_token, mask, loss_agg, normalizer)
    return loss, loss_stats(pg, kl, clipped > unclipped, ratio, mask)


def overlong_penalty(lengths: torch.Tensor, *, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """(B,) response lengths in tokens -> (B,) reward additions, <= 0: min(-(length - (max_len - buffer)) /
    buffer x factor, 0). Zero up to max_len - buffer tokens; -factor at max_len."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"the overlong buffer must be in (0, max_len = {max_len}], got {buffer}")
    exceed = lengths.float() - (max_len - buffer)
    return torch.clamp(-exceed / buffer * factor, max=0.0)
