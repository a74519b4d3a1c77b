"""PPO math against hand-computed values, and the SPMD normalisation of the value loss: shard losses and
gradients add up to the whole batch's."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.config import LossAgg
from posttrain.rl.algorithms.grpo import policy_loss
from posttrain.rl.algorithms.ppo import explained_variance, gae_advantages, masked_whiten, token_rewards, value_loss


def test_token_rewards_score_on_last_valid_token_and_kl_on_every_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]])
    scores = torch.tensor([1.0, -2.0, 3.0, 5.0])
    r = token_rewards(scores, mask)
    assert r.tolist() == [[0, 0, 1, 0], [-2, 0, 0, 0], [0, 0, 0, 3], [0, 0, 0, 0]]  # empty row: no reward
    kl = torch.full((4, 4), 2.0)
    kl[0, 3] = float("nan")  # off the mask: never read
    r = token_rewards(scores, mask, kl=kl, kl_coef=0.1)
    assert torch.allclose(r, torch.tensor([[-0.2, -0.2, 0.8, 0], [-2.2, 0, 0, 0], [-0.2, -0.2, 0, 2.8],
                                           [0, 0, 0, 0]]))


def test_gae_with_gamma_lam_one_and_zero_values_gives_reward_to_go():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.5, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    adv, ret = gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=1.0)
    assert ret.tolist() == [[6, 5, 3, 0], [0.5, 0, 0, 0], [4, 3, 2, 1]]
    assert torch.allclose(adv, masked_whiten(ret, mask))
    valid = adv[mask.bool()]
    assert abs(float(valid.mean())) < 1e-6 and float(valid.std()) == pytest.approx(1.0, abs=1e-6)


def test_gae_by_hand_with_discounting_and_a_masked_observation_token():
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[0.0, 7.0, 0.0, 1.0], [1.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 9.0, 0.2, 0.4], [0.3, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])  # row 0's token 1 is an observation: stepped over
    _, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    a3 = 1.0 - 0.4
    a2 = 0.0 + gamma * 0.4 - 0.2 + gamma * lam * a3
    a0 = 0.0 + gamma * 0.2 - 0.5 + gamma * lam * a2  # token 1's reward and value play no part
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a2 + 9.0, a2 + 0.2, a3 + 0.4])  # masked: carried A + V
    b3 = 2.0
    b2 = gamma * lam * b3
    b1 = gamma * lam * b2
    b0 = 1.0 - 0.3 + gamma * lam * b1
    assert ret[1].tolist() == pytest.approx([b0 + 0.3, b1, b2, b3])


def test_whitening_needs_two_tokens():
    with pytest.raises(ValueError):
        gae_advantages(torch.ones(2, 3), torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]), gamma=1, lam=1)


def test_value_loss_by_hand():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    ret = torch.tensor([[1.0, 1.0, 5.0]])
    new = torch.tensor([[0.5, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, st = value_loss(new, old, ret, mask, clip_range=0.2)
    # token 0: (0.5-1)^2 = 0.25 vs clipped (0.2-1)^2 = 0.64 -> 0.64 (clipped term larger)
    # token 1: (2-1)^2 = 1 vs clipped (0.2-1)^2 = 0.64 -> 1
    assert float(loss) == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert st.clip_fraction == pytest.approx(0.5) and st.tokens == 2 and st.values_mean == pytest.approx(1.25)


@pytest.mark.parametrize("shards", [2, 4])
def test_value_loss_shards_with_a_global_normalizer_add_up(shards):
    torch.manual_seed(0)
    B, T = 8, 6
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 1])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    theta = torch.randn(B, T, requires_grad=True)
    old, ret = torch.randn(B, T), torch.randn(B, T)
    full, _ = value_loss(theta, old, ret, mask, clip_range=0.3)
    (g_full,) = torch.autograd.grad(full, theta)
    norm = float(mask.sum())
    total, g_sum = 0.0, torch.zeros_like(theta)
    for idx in torch.arange(B).chunk(shards):
        loss, _ = value_loss(theta[idx], old[idx], ret[idx], mask[idx], clip_range=0.3, normalizer=norm)
        (g,) = torch.autograd.grad(loss, theta)
        total += float(loss.detach())
        g_sum += g
    assert total == pytest.approx(float(full.detach()), abs=1e-6)
    assert torch.allclose(g_sum, g_full, atol=1e-6)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_clip_ratio_c_must_exceed_one(c):
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(z, z, torch.ones(2), torch.ones(2, 3), clip_low=0.2, clip_high=0.2, loss_agg=LossAgg.TOKEN_MEAN,
                    clip_ratio_c=c)


def test_dual_clip_by_hand():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[10.0, 10.0, 0.1]]))
    adv = torch.tensor([[-1.0, 2.0, -1.0]])  # token-level advantages
    mask = torch.ones(1, 3)
    kw = {"clip_low": 0.2, "clip_high": 0.2, "loss_agg": LossAgg.TOKEN_MEAN}
    loss, st = policy_loss(logp, old, adv, mask, **kw)
    # PPO: token 0 -min(-10, -1.2) = 10; token 1 -min(20, 2.4) = -2.4; token 2 -min(-0.1, -0.8) = 0.8
    assert float(loss) == pytest.approx((10 - 2.4 + 0.8) / 3)
    loss, st = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0, **kw)
    # dual-clip caps token 0 at -A * 3 = 3; A > 0 and small ratios are untouched
    assert float(loss) == pytest.approx((3 - 2.4 + 0.8) / 3)
    assert st.clip_fraction_lower == pytest.approx(1 / 3) and st.clip_fraction == pytest.approx(2 / 3)


def test_token_level_advantages_equal_broadcast_sequence_advantages():
    torch.manual_seed(1)
    logp, old, mask = torch.randn(4, 5), torch.randn(4, 5), (torch.rand(4, 5) < 0.7).float()
    adv = torch.randn(4)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "loss_agg": LossAgg.SEQ_MEAN}
    a, sa = policy_loss(logp, old, adv, mask, **kw)
    b, sb = policy_loss(logp, old, adv[:, None].expand(4, 5), mask, **kw)
    assert torch.equal(a, b) and sa == sb


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask, eps=0.0) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.0), ret, mask, eps=0.0) == pytest.approx(0.0)
    # V = R + noise of variance Var[R]: explained variance 0 (only the valid tokens count)
    assert explained_variance(ret + torch.tensor([[1.0, -1.0, 0.0, 0.0]]), ret, mask, eps=0.0) == pytest.approx(0.0)
    assert math.isnan(explained_variance(ret, ret, torch.tensor([[1, 0, 0, 0]])))  # one token: no variance
