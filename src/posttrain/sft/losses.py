"""The dense post-training objectives as pure tensor functions: DPO / IPO on preference pairs, the Bradley-Terry
reward-model loss, and token-level distillation divergences. No model, no distributed code: the SPMD trainer
computes the log-probs, rewards or logits, calls these, and reduces the per-item losses itself (sum / GLOBAL
count of pairs or tokens), so a batch split over ranks and micro-batches gives the same loss and gradients.

- DPO (Rafailov et al. 2023, "Direct Preference Optimization"): with the margin
  m = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)) of summed completion log-probs,
  loss = -log sigmoid(beta m). Label smoothing ls (conservative DPO: ls is the assumed share of flipped labels)
  gives -(1 - ls) log sigmoid(beta m) - ls log sigmoid(-beta m).
- IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences"):
  (m - 1 / (2 beta))^2, with the margin built from token-MEAN log-probs (TRL's length normalisation, which the
  IPO authors confirmed matches the paper's experiments); the caller passes the means.
- RPO / SFT-regularised DPO (Pang et al. 2024, Liu et al. 2024): DPO plus sft_weight times the NLL of the chosen
  completions. The NLL is a token mean over the batch, not a per-pair quantity, so the trainer adds it; it is
  not in this module.
- Bradley-Terry reward models (Bradley & Terry 1952; Ouyang et al. 2022): -log sigmoid(r_c - r_r), plus TRL's
  centring term coef * (r_c + r_r)^2 (Eisenstein et al. 2023) that keeps scores near 0.
- Distillation (GKD, Agarwal et al. 2024, "On-Policy Distillation of Language Models"): per token, over the
  full vocabulary, forward KL(teacher || student), reverse KL(student || teacher), or the generalised JSD with
  mixture M = beta teacher + (1 - beta) student: beta KL(teacher || M) + (1 - beta) KL(student || M).

Left out: TRL's other DPO variants (hinge, robust, EXO, NCA, BCO, SPPO, AOT, APO, DiscoPOP, f-divergences,
LD-DPO, WPO weighting), reward margins per pair, and the temperature^2 gradient rescaling of Hinton-style
distillation (neither TRL's GKD nor its DistillationTrainer apply it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.config import DistillLoss, DPOLoss


def dpo_losses(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *,
               beta: float, loss: DPOLoss, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """(per-pair losses (N,), chosen rewards (N,), rejected rewards (N,)). Inputs are per-sequence log-probs (N,):
    summed over the completion's tokens for SIGMOID; for IPO the caller passes token-MEAN log-probs (as TRL does).

    rewards = beta * (policy - ref), detached.
    sigmoid: -logsigmoid(beta*m)*(1-ls) - logsigmoid(-beta*m)*ls,   m = (pc - rc) - (pr - rr)
    ipo:     (m - 1/(2*beta))**2     (label smoothing does not apply)
    """
    chosen_logratio = policy_chosen - ref_chosen  # (N,)
    rejected_logratio = policy_rejected - ref_rejected  # (N,)
    margin = chosen_logratio - rejected_logratio  # (N,)
    if loss == DPOLoss.SIGMOID:
        losses = -F.logsigmoid(beta * margin) * (1 - label_smoothing)
        if label_smoothing:  # skip the flipped term when it is 0: 0 * inf would be nan for huge margins
            losses = losses - F.logsigmoid(-beta * margin) * label_smoothing
    elif loss == DPOLoss.IPO:
        if label_smoothing:
            raise ValueError("label_smoothing applies to the sigmoid loss only")
        losses = (margin - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss {loss!r}")
    return losses, beta * chosen_logratio.detach(), beta * rejected_logratio.detach()


def bradley_terry_losses(r_chosen: Tensor, r_rejected: Tensor, *, center_rewards_coef: float = 0.0) -> Tensor:
    """(N,) per-pair  -logsigmoid(r_c - r_r) + coef * (r_c + r_r)**2  for scalar rewards r_c, r_r (N,).

    TRL's RewardTrainer.compute_loss returns mean(-logsigmoid(r_c - r_r)) + coef * mean((r_c + r_r)^2): both
    are means over the same pairs, so the mean of these per-pair losses equals TRL's loss exactly.
    """
    losses = -F.logsigmoid(r_chosen - r_rejected)  # (N,)
    if center_rewards_coef:
        losses = losses + center_rewards_coef * (r_chosen + r_rejected) ** 2
    return losses


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """(M,) KL(p || q) = sum_v p (log p - log q) from log-probs (M, V); 0 log 0 counts as 0."""
    return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)


def distill_token_losses(student_logits: Tensor, teacher_logits: Tensor, *, loss: DistillLoss, beta: float = 0.5,
                         temperature: float = 1.0) -> Tensor:
    """(M,) per-token divergence for logits of shape (M, V) (the caller selects the assistant-token rows).

    forward_kl: KL(teacher || student)   (mass-covering; what TRL's GKD computes for beta = 0)
    reverse_kl: KL(student || teacher)   (mode-seeking; TRL's GKD for beta = 1)
    jsd:        beta * KL(teacher || M) + (1 - beta) * KL(student || M),   M = beta * teacher + (1 - beta) * student
    TRL's convention, in GKDTrainer.generalized_jsd_loss and its DistillationTrainer alike. The JSD tends to 0 at
    both ends of beta, so like TRL we read beta = 0 / 1 as forward / reverse KL (the config refuses them for jsd).
    Both distributions are log_softmax(logits / temperature), computed in float32 at least (float64 stays float64).
    """
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_s = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)  # (M, V)
    log_t = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)  # (M, V)
    if loss == DistillLoss.FORWARD_KL or (loss == DistillLoss.JSD and beta == 0):
        return _kl(log_t, log_s)
    if loss == DistillLoss.REVERSE_KL or (loss == DistillLoss.JSD and beta == 1):
        return _kl(log_s, log_t)
    if loss != DistillLoss.JSD:
        raise ValueError(f"unknown distillation loss {loss!r}")
    if not 0 < beta < 1:
        raise ValueError(f"jsd needs 0 <= beta <= 1, got {beta}")
    # log M = logsumexp(log t + log beta, log s + log(1 - beta)): no exp of log-probs summed outside the log
    log_m = torch.logsumexp(torch.stack([log_t + math.log(beta), log_s + math.log1p(-beta)]), dim=0)  # (M, V)
    return beta * _kl(log_t, log_m) + (1 - beta) * _kl(log_s, log_m)
