"""GRPO math against hand-computed values, and the SPMD normalisation: shard losses and gradients add up to
the whole batch's."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.config import KLEstimator, LossAgg
from posttrain.rl.algorithms.grpo import group_advantages, kl_penalty, policy_loss


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # two groups of 4
    # group 1: mean 0.5, unbiased std = sqrt(((.5^2)*4)/3) = 0.57735
    a = group_advantages(r, 4, std_normalize=True)
    assert a[:4].tolist() == pytest.approx([0.5 / 0.57735, -0.5 / 0.57735, -0.5 / 0.57735, 0.5 / 0.57735], abs=1e-4)
    assert a[4:].tolist() == [0.0] * 4  # all-equal group: no signal
    assert group_advantages(r, 4, std_normalize=False)[:4].tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ValueError):
        group_advantages(r, 3, std_normalize=True)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])  # d = [0.5, -1.0]
    assert kl_penalty(logp, ref, KLEstimator.K1).tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(logp, ref, KLEstimator.K2).tolist() == pytest.approx([0.125, 0.5])
    assert kl_penalty(logp, ref, KLEstimator.K3).tolist() == pytest.approx(
        [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0])
    assert (kl_penalty(torch.randn(100), torch.randn(100), KLEstimator.K3) >= 0).all()


def test_on_policy_loss_and_asymmetric_clipping_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    old = torch.zeros(2, 3)
    # ratio 1 everywhere: loss = -(2 + 2 - 1) / 3 valid tokens (the padding token contributes nothing)
    loss, st = policy_loss(old.clone(), old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg=LossAgg.TOKEN_MEAN)
    assert float(loss) == pytest.approx(-1.0) and st.clip_fraction == 0.0 and st.tokens == 3
    # seq mean: seq 1 mean -2, seq 2 mean +1 -> -0.5
    loss, _ = policy_loss(old.clone(), old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg=LossAgg.SEQ_MEAN)
    assert float(loss) == pytest.approx(-0.5)
    # ratios: token (0,0)=1.5 with A>0 -> clipped at 1.28; (0,1)=1.1 inside; (1,0)=0.5 with A<0 -> clipped at 0.8
    logp = torch.log(torch.tensor([[1.5, 1.1, 9.0], [0.5, 1.0, 1.0]]))
    loss, st = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg=LossAgg.TOKEN_MEAN)
    expected = -(1.28 * 2 + 1.1 * 2 + min(0.5 * -1.0, 0.8 * -1.0)) / 3
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    assert st.clip_fraction == pytest.approx(2 / 3)


@pytest.mark.parametrize("agg", [LossAgg.TOKEN_MEAN, LossAgg.SEQ_MEAN])
@pytest.mark.parametrize("shards", [2, 4])
def test_shard_losses_and_gradients_sum_to_the_full_batch(agg, shards):
    torch.manual_seed(0)
    B, T = 8, 6
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 1])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    theta = torch.randn(B, T, requires_grad=True)
    old, ref, adv = torch.randn(B, T) * 0.1, torch.randn(B, T) * 0.1, torch.randn(B)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "loss_agg": agg, "kl_coef": 0.1, "kl_estimator": KLEstimator.K3}
    full, _ = policy_loss(theta * 0.1, old, adv, mask, ref_logp=ref, **kw)
    (g_full,) = torch.autograd.grad(full, theta)
    norm = float(mask.sum()) if agg == LossAgg.TOKEN_MEAN else float(B)
    total, g_sum = 0.0, torch.zeros_like(theta)
    for idx in torch.arange(B).chunk(shards):
        loss, _ = policy_loss(theta[idx] * 0.1, old[idx], adv[idx], mask[idx], ref_logp=ref[idx], normalizer=norm, **kw)
        (g,) = torch.autograd.grad(loss, theta)
        total += float(loss)
        g_sum += g
    assert total == pytest.approx(float(full), abs=1e-6)
    assert torch.allclose(g_sum, g_full, atol=1e-6)
