"""The dense objectives' tensor math (posttrain.sft.losses) on hand-computed cases and the properties that pin it:
DPO/cDPO/IPO, Bradley-Terry with centring, forward/reverse KL and generalised JSD distillation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posttrain.config import DistillLoss, DPOLoss
from posttrain.sft.losses import bradley_terry_losses, distill_token_losses, dpo_losses


def t(*v: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(v, dtype=dtype)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------- DPO / IPO


def test_dpo_sigmoid_hand_computed():
    # margin = (-1 - -1.5) - (-2 - -1.5) = 1;  loss = -log sigmoid(beta) = softplus(-beta)
    losses, chosen, rejected = dpo_losses(t(-1.0), t(-2.0), t(-1.5), t(-1.5), beta=0.1, loss=DPOLoss.SIGMOID)
    assert losses.shape == (1,)
    assert losses.item() == pytest.approx(softplus(-0.1), abs=1e-12)
    assert chosen.item() == pytest.approx(0.05) and rejected.item() == pytest.approx(-0.05)
    # zero margin: log 2 whatever beta
    losses, _, _ = dpo_losses(t(-3.0, -1.0), t(-2.0, -4.0), t(-3.0, -1.0), t(-2.0, -4.0), beta=0.7,
                              loss=DPOLoss.SIGMOID)
    assert torch.allclose(losses, t(math.log(2), math.log(2)))


def test_dpo_rewards_are_detached_and_losses_per_pair():
    pc = t(-1.0, -2.0, -0.5).requires_grad_()
    pr = t(-2.0, -1.0, -3.0).requires_grad_()
    losses, chosen, rejected = dpo_losses(pc, pr, t(-1.0, -1.0, -1.0), t(-1.0, -1.0, -1.0), beta=0.5,
                                          loss=DPOLoss.SIGMOID)
    assert losses.shape == chosen.shape == rejected.shape == (3,)
    assert not chosen.requires_grad and not rejected.requires_grad
    assert torch.allclose(chosen, 0.5 * t(0.0, -1.0, 0.5)) and torch.allclose(rejected, 0.5 * t(-1.0, 0.0, -2.0))
    # pair 2's loss depends on pair 2's inputs only
    losses[1].backward()
    assert pc.grad[[0, 2]].abs().sum() == 0 and pr.grad[[0, 2]].abs().sum() == 0
    assert pc.grad[1] < 0 < pr.grad[1]  # descending the loss raises chosen and lowers rejected


def test_label_smoothing():
    pc, pr, rc, rr = t(-1.0, -1.0), t(-3.0, -1.0), t(-1.0, -1.0), t(-1.0, -2.0)  # margins 2, -1
    beta, ls = 0.5, 0.2
    plain, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID)
    smooth, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID, label_smoothing=ls)
    for m, p_loss, s_loss in zip((2.0, -1.0), plain.tolist(), smooth.tolist(), strict=True):
        assert p_loss == pytest.approx(softplus(-beta * m), abs=1e-12)
        assert s_loss == pytest.approx((1 - ls) * softplus(-beta * m) + ls * softplus(beta * m), abs=1e-12)
    assert smooth[0] > plain[0]  # a correct preference costs more when some labels may be flipped
    # ls = 0.5: the labels carry no information, the loss is even in the margin
    half, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID, label_smoothing=0.5)
    flipped, _, _ = dpo_losses(pr, pc, rr, rc, beta=beta, loss=DPOLoss.SIGMOID, label_smoothing=0.5)
    assert torch.allclose(half, flipped)
    # conservative DPO's optimum is a finite margin: sigmoid(beta m*) = 1 - ls
    m = torch.linspace(-20, 40, 6001, dtype=torch.float64)
    z = torch.zeros_like(m)
    curve, _, _ = dpo_losses(m, z, z, z, beta=beta, loss=DPOLoss.SIGMOID, label_smoothing=ls)
    assert m[curve.argmin()].item() == pytest.approx(math.log((1 - ls) / ls) / beta, abs=0.01)


def test_ipo_zero_at_target_margin():
    for beta in (0.1, 0.5, 2.0):
        target = 1 / (2 * beta)
        losses, _, _ = dpo_losses(t(target - 1.0), t(-1.0), t(0.0), t(0.0), beta=beta, loss=DPOLoss.IPO)
        assert losses.item() == pytest.approx(0.0, abs=1e-12)
        losses, _, _ = dpo_losses(t(0.0), t(0.0), t(0.0), t(0.0), beta=beta, loss=DPOLoss.IPO)
        assert losses.item() == pytest.approx(1 / (4 * beta ** 2))
    # quadratic: overshooting the target is penalised as much as falling short by the same amount
    over, _, _ = dpo_losses(t(1.0 + 3.0), t(0.0), t(0.0), t(0.0), beta=0.5, loss=DPOLoss.IPO)
    under, _, _ = dpo_losses(t(1.0 - 3.0), t(0.0), t(0.0), t(0.0), beta=0.5, loss=DPOLoss.IPO)
    assert over.item() == pytest.approx(9.0) and under.item() == pytest.approx(9.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_losses(t(0.0), t(0.0), t(0.0), t(0.0), beta=0.5, loss=DPOLoss.IPO, label_smoothing=0.1)


def test_dpo_extreme_margins_finite_with_finite_gradients():
    pc = t(5000.0, -5000.0, 0.0).requires_grad_()
    pr = t(0.0, 0.0, 0.0).requires_grad_()
    z = t(0.0, 0.0, 0.0)
    for loss, ls in ((DPOLoss.SIGMOID, 0.0), (DPOLoss.SIGMOID, 0.1), (DPOLoss.IPO, 0.0)):
        losses, _, _ = dpo_losses(pc, pr, z, z, beta=0.1, loss=loss, label_smoothing=ls)
        assert torch.isfinite(losses).all()
        (g_c, g_r) = torch.autograd.grad(losses.sum(), (pc, pr))
        assert torch.isfinite(g_c).all() and torch.isfinite(g_r).all()


def test_dpo_float32_and_float64():
    for dtype in (torch.float32, torch.float64):
        x = t(-1.0, -2.0, dtype=dtype)
        losses, chosen, _ = dpo_losses(x, x - 1, x + 0.5, x, beta=0.1, loss=DPOLoss.SIGMOID)
        assert losses.dtype == chosen.dtype == dtype


# ---------------------------------------------------------------- Bradley-Terry


def test_bradley_terry_hand_computed_and_symmetric():
    rc, rr = t(1.0, 0.0, -2.0), t(0.0, 0.0, 1.0)
    losses = bradley_terry_losses(rc, rr)
    assert torch.allclose(losses, t(softplus(-1.0), math.log(2), softplus(3.0)))
    # swapping chosen and rejected: softplus(-d) - softplus(d) = -d
    assert torch.allclose(losses - bradley_terry_losses(rr, rc), -(rc - rr))
    # without centring only the difference matters
    assert torch.allclose(bradley_terry_losses(rc + 7.0, rr + 7.0), losses)


def test_bradley_terry_centring():
    rc, rr = t(3.0, 1.0), t(1.0, -1.0)
    coef = 0.01
    centred = bradley_terry_losses(rc, rr, center_rewards_coef=coef)
    assert torch.allclose(centred - bradley_terry_losses(rc, rr), coef * t(16.0, 0.0))
    # the centring term pulls the scores' sum towards 0 (the logistic term's gradients on r_c and r_r cancel)
    rc_g, rr_g = rc.clone().requires_grad_(), rr.clone().requires_grad_()
    bradley_terry_losses(rc_g, rr_g, center_rewards_coef=1.0).sum().backward()
    assert (rc_g.grad + rr_g.grad)[0].item() == pytest.approx(2 * 2 * 4.0)  # d/dr_c + d/dr_r of (r_c + r_r)^2
    assert (rc_g.grad + rr_g.grad)[1].item() == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------- distillation


def logits(rows: int, vocab: int, seed: int, scale: float = 2.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


ALL = [(DistillLoss.FORWARD_KL, 0.5), (DistillLoss.REVERSE_KL, 0.5), (DistillLoss.JSD, 0.5), (DistillLoss.JSD, 0.1),
       (DistillLoss.JSD, 0.9)]


def test_kl_hand_computed_two_tokens():
    teacher = t(0.0, 0.0)[None]  # p = (1/2, 1/2)
    student = t(math.log(3.0), 0.0)[None]  # q = (3/4, 1/4)
    fwd = distill_token_losses(student, teacher, loss=DistillLoss.FORWARD_KL)
    rev = distill_token_losses(student, teacher, loss=DistillLoss.REVERSE_KL)
    assert fwd.item() == pytest.approx(0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25), abs=1e-12)
    assert rev.item() == pytest.approx(0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5), abs=1e-12)
    assert fwd.item() != pytest.approx(rev.item())  # KL is not symmetric
    # jsd, beta = 0.3: M = 0.3 p + 0.7 q
    m = (0.3 * 0.5 + 0.7 * 0.75, 0.3 * 0.5 + 0.7 * 0.25)
    want = 0.3 * sum(p * math.log(p / mi) for p, mi in zip((0.5, 0.5), m, strict=True)) + \
        0.7 * sum(q * math.log(q / mi) for q, mi in zip((0.75, 0.25), m, strict=True))
    got = distill_token_losses(student, teacher, loss=DistillLoss.JSD, beta=0.3)
    assert got.item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("loss", "beta"), ALL)
def test_zero_when_equal_positive_otherwise(loss, beta):
    s = logits(6, 13, seed=1)
    same = distill_token_losses(s, s.clone(), loss=loss, beta=beta)
    assert same.shape == (6,)
    assert torch.allclose(same, torch.zeros(6), atol=1e-6)
    # a constant shift of the logits is the same distribution
    assert torch.allclose(distill_token_losses(s, s + 3.0, loss=loss, beta=beta), torch.zeros(6), atol=1e-5)
    other = distill_token_losses(s, logits(6, 13, seed=2), loss=loss, beta=beta)
    assert (other > 1e-3).all()


def test_forward_and_reverse_kl_differ_and_swap():
    s, te = logits(8, 17, seed=3, dtype=torch.float64), logits(8, 17, seed=4, dtype=torch.float64)
    fwd = distill_token_losses(s, te, loss=DistillLoss.FORWARD_KL)
    rev = distill_token_losses(s, te, loss=DistillLoss.REVERSE_KL)
    assert not torch.allclose(fwd, rev)
    assert torch.allclose(fwd, distill_token_losses(te, s, loss=DistillLoss.REVERSE_KL))
    # against the definition, computed independently from probabilities
    p, q = te.softmax(-1), s.softmax(-1)
    assert torch.allclose(fwd, (p * (p.log() - q.log())).sum(-1))


def test_jsd_bounds_symmetry_and_limits():
    s, te = logits(8, 17, seed=5, dtype=torch.float64), logits(8, 17, seed=6, dtype=torch.float64)
    jsd = distill_token_losses(s, te, loss=DistillLoss.JSD, beta=0.5)
    assert ((jsd > 0) & (jsd <= math.log(2))).all()
    assert torch.allclose(jsd, distill_token_losses(te, s, loss=DistillLoss.JSD, beta=0.5))  # symmetric at 0.5
    # beta <-> 1 - beta with the roles swapped
    assert torch.allclose(distill_token_losses(s, te, loss=DistillLoss.JSD, beta=0.2),
                          distill_token_losses(te, s, loss=DistillLoss.JSD, beta=0.8))
    # disjoint supports: the JSD reaches log 2
    far_s = t(60.0, -60.0, -60.0, -60.0)[None]
    far_t = t(-60.0, -60.0, -60.0, 60.0)[None]
    assert distill_token_losses(far_s, far_t, loss=DistillLoss.JSD, beta=0.5).item() == pytest.approx(math.log(2))
    # generalised JSD is bounded by its entropy-like term: beta log(1/beta) + (1-beta) log(1/(1-beta))
    b = 0.3
    g = distill_token_losses(s, te, loss=DistillLoss.JSD, beta=b)
    assert (g <= -(b * math.log(b) + (1 - b) * math.log(1 - b)) + 1e-12).all()
    # TRL's reading of the end points: 0 is forward KL, 1 reverse KL
    assert torch.allclose(distill_token_losses(s, te, loss=DistillLoss.JSD, beta=0.0),
                          distill_token_losses(s, te, loss=DistillLoss.FORWARD_KL))
    assert torch.allclose(distill_token_losses(s, te, loss=DistillLoss.JSD, beta=1.0),
                          distill_token_losses(s, te, loss=DistillLoss.REVERSE_KL))
    with pytest.raises(ValueError, match="beta"):
        distill_token_losses(s, te, loss=DistillLoss.JSD, beta=1.5)


@pytest.mark.parametrize(("loss", "beta"), ALL)
def test_temperature(loss, beta):
    s, te = logits(8, 17, seed=7, dtype=torch.float64), logits(8, 17, seed=8, dtype=torch.float64)
    at2 = distill_token_losses(s, te, loss=loss, beta=beta, temperature=2.0)
    assert torch.allclose(at2, distill_token_losses(s / 2, te / 2, loss=loss, beta=beta))
    # softer distributions are closer: the divergence shrinks as the temperature rises (here, on average)
    at1 = distill_token_losses(s, te, loss=loss, beta=beta)
    at8 = distill_token_losses(s, te, loss=loss, beta=beta, temperature=8.0)
    assert at1.mean() > at2.mean() > at8.mean() > 0


@pytest.mark.parametrize(("loss", "beta"), ALL)
def test_gradients_finite_for_peaked_logits(loss, beta):
    s = (logits(4, 9, seed=9) * 30).requires_grad_()  # near one-hot: exp underflows to 0 in many entries
    te = logits(4, 9, seed=10) * 30
    out = distill_token_losses(s, te, loss=loss, beta=beta)
    assert torch.isfinite(out).all() and (out >= -1e-5).all()
    (g,) = torch.autograd.grad(out.sum(), s)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_dtypes():
    s64, t64 = logits(3, 7, seed=11, dtype=torch.float64), logits(3, 7, seed=12, dtype=torch.float64)
    for loss, beta in ALL:
        out64 = distill_token_losses(s64, t64, loss=loss, beta=beta)
        assert out64.dtype == torch.float64  # float64 is kept, not rounded to float32
        out16 = distill_token_losses(s64.bfloat16(), t64.bfloat16(), loss=loss, beta=beta)
        assert out16.dtype == torch.float32  # low precision is computed in float32
        ref = distill_token_losses(s64.bfloat16().double(), t64.bfloat16().double(), loss=loss, beta=beta)
        assert torch.allclose(out16.double(), ref, atol=1e-5)
    # the forward KL gradient w.r.t. student logits is softmax(s) - softmax(t), the textbook result
    s = s64.clone().requires_grad_()
    (g,) = torch.autograd.grad(distill_token_losses(s, t64, loss=DistillLoss.FORWARD_KL).sum(), s)
    assert torch.allclose(g, F.softmax(s64, -1) - F.softmax(t64, -1))
