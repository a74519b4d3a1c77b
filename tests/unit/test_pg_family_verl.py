"""The policy-gradient family's math (posttrain.rl.algorithms.pg, grpo's Dr. GRPO aggregation) equals verl 0.9.1's
on fixed seeded inputs, within 1e-6. verl runs in a subprocess from the throwaway folder of
tests/unit/test_ppo_math_verl.py (installed --no-deps); inputs are float64 and travel as JSON.

What is compared, verl side (real functions):
- core_algos.compute_rloo_outcome_advantage vs rloo_advantages, groups of 4 and of 1 (verl leaves a lone
  sample's score as it is).
- core_algos.compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False) vs group_advantages(std_normalize=
  False): Dr. GRPO's advantage.
- core_algos.compute_policy_loss_vanilla with loss_agg_mode "seq-mean-token-sum-norm" (its horizon: the mask's
  width; its dual-clip at verl's default clip_ratio_c 3) vs policy_loss(loss_agg=SEQ_MEAN_TOKEN_SUM_NORM):
  Dr. GRPO's loss.
- core_algos.compute_reinforce_plus_plus_outcome_advantage (gamma 1 and 0.99) vs reinforce_pp_returns, on
  token rewards with the outcome on the last valid token and a k1 KL penalty on every token, right-padded masks
  and masks with holes.
- core_algos.compute_policy_loss_gspo with an ActorConfig (clip 3e-4 / 4e-4, the paper's), "seq-mean-token-mean"
  and "token-mean", sequence- and token-level advantages, log-ratios within +-1e-3 so some sequences clip and
  some do not: loss and clip fraction; and its GRADIENT w.r.t. log p (computed by autograd on both sides).
- verl.workers.reward_manager.dapo's overlong rule, `min(-exceed / buffer x factor, 0)`, is a line inside a
  reward manager that needs a tokenizer and a scorer: it is executed from that file's source with `ast`
  (the `if self.overlong_buffer_cfg...` block's arithmetic, run per length), and compared with
  overlong_penalty.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.config import KLEstimator, LossAgg
from posttrain.rl.algorithms.grpo import group_advantages, kl_penalty, policy_loss
from posttrain.rl.algorithms.pg import gspo_loss, overlong_penalty, reinforce_pp_returns, rloo_advantages
from posttrain.rl.algorithms.ppo import token_rewards
from tests.unit.test_ppo_math_verl import _case, _close, _t, run_verl

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6
SEEDS = (0, 1, 2, 3)
GROUP = 4
GAMMAS = (1.0, 0.99)
GSPO_LOW, GSPO_HIGH = 3e-4, 4e-4
KL_COEF = 0.05
OVERLONG = {"max_len": 16, "buffer": 4, "factor": 1.5}

VERL_SCRIPT = r'''
import ast, json, os, sys
import numpy as np
import torch
from omegaconf import OmegaConf
import verl
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

x = json.load(sys.stdin)
T = lambda v: torch.tensor(v, dtype=torch.float64)
out = []
for c in x["cases"]:
    mask = torch.tensor(c["mask"], dtype=torch.int64)
    b, t = mask.shape
    r = {}
    outcome = T(c["outcome"])  # (B, T): the score on the last valid token
    for g in (x["group"], 1):
        index = np.array([i // g for i in range(b)])
        adv, _ = core_algos.compute_rloo_outcome_advantage(outcome.clone(), mask, index)
        r[f"rloo/{g}"] = adv.tolist()
    index = np.array([i // x["group"] for i in range(b)])
    adv, _ = core_algos.compute_grpo_outcome_advantage(outcome.clone(), mask, index, norm_adv_by_std_in_grpo=False)
    r["dr_grpo_adv"] = adv.tolist()
    cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                            "global_batch_info": {}})
    loss, m = core_algos.compute_policy_loss_vanilla(T(c["old_logp"]), T(c["logp"]), T(c["adv_token"]), mask,
                                                     "seq-mean-token-sum-norm", cfg)
    r["dr_grpo_loss"] = {"loss": float(loss), "clipfrac": m["actor/pg_clipfrac"]}
    for gamma in x["gammas"]:
        adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
            T(c["kl_rewards"]), mask, config=OmegaConf.create({"gamma": gamma}))
        r[f"rpp/{gamma}"] = adv.tolist()
    acfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       clip_ratio_low=x["gspo_low"], clip_ratio_high=x["gspo_high"])
    for kind in ("token", "seq"):
        adv = T(c["adv_token"]) if kind == "token" else T(c["adv_seq"])[:, None].expand(b, t)
        for agg in ("seq-mean-token-mean", "token-mean"):
            logp = T(c["gspo_logp"]).requires_grad_(True)
            loss, m = core_algos.compute_policy_loss_gspo(T(c["old_logp"]), logp, adv, mask, agg, acfg)
            loss.backward()
            r[f"gspo/{kind}/{agg}"] = {"loss": float(loss), "clipfrac": m["actor/pg_clipfrac"],
                                       "grad": logp.grad.tolist()}
    out.append(r)

# DAPO's overlong rule, taken from its reward manager's source: the arithmetic of the overlong block
src = open(os.path.join(os.path.dirname(verl.__file__), "workers", "reward_manager", "dapo.py")).read()
body = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.If) and "overlong_buffer_cfg.enable" in ast.unparse(n.test)
        and any("overlong_reward" in ast.unparse(s) for s in n.body)][0].body
assigns = [s for s in body if isinstance(s, ast.Assign)]
code = compile(ast.Module(body=assigns, type_ignores=[]), "dapo.py", "exec")
cfg = OmegaConf.create({"len": x["overlong"]["buffer"], "penalty_factor": x["overlong"]["factor"]})
class Self: overlong_buffer_cfg = cfg; max_resp_len = x["overlong"]["max_len"]
pen = []
for L in x["lengths"]:
    ns = {"self": Self, "valid_response_length": torch.tensor(L), "min": min}
    exec(code, ns)
    pen.append(float(ns["overlong_reward"]))
print(json.dumps({"cases": out, "overlong": pen}))
'''


def _family_case(seed: int, holes: bool = False) -> dict:
    c = _case(seed, holes)
    mask = torch.tensor(c["mask"])
    b, t = mask.shape
    g = torch.Generator().manual_seed(100 + seed)
    keep = (b // GROUP) * GROUP or GROUP  # whole groups
    if keep > b:  # too few rows for one group of 4: repeat rows
        idx = [i % b for i in range(keep)]
        c = {k: ([v[i] for i in idx] if isinstance(v, list) and len(v) == b else v) for k, v in c.items()}
        mask = torch.tensor(c["mask"])
        b = keep
    else:
        c = {k: (v[:keep] if isinstance(v, list) and len(v) == b else v) for k, v in c.items()}
        mask, b = torch.tensor(c["mask"]), keep
    scores = (torch.rand(b, generator=g) < 0.5).double()  # outcome scores 0/1, with ties in groups
    scores[:GROUP] = 1.0  # one group whose scores are all equal
    old = torch.tensor(c["old_logp"], dtype=torch.float64)
    kl = kl_penalty(old, torch.tensor(c["ref_logp"], dtype=torch.float64), KLEstimator.K1)
    c["outcome"] = token_rewards(scores, mask).tolist()
    c["kl_rewards"] = token_rewards(scores, mask, kl=kl, kl_coef=KL_COEF).tolist()
    c["scores01"] = scores.tolist()
    c["gspo_logp"] = (old + (torch.rand(b, t, generator=g, dtype=torch.float64) * 2e-3 - 1e-3)).tolist()
    return c


def _inputs() -> dict:
    return {"cases": [_family_case(s) for s in SEEDS] + [_family_case(10, holes=True)], "group": GROUP,
            "gammas": list(GAMMAS), "gspo_low": GSPO_LOW, "gspo_high": GSPO_HIGH, "overlong": OVERLONG,
            "lengths": list(range(OVERLONG["max_len"] + 1))}


CASES = range(len(SEEDS) + 1)


@pytest.fixture(scope="module")
def case() -> tuple[dict, dict]:
    x = _inputs()
    return x, run_verl(VERL_SCRIPT, x)


@pytest.mark.parametrize("group", [GROUP, 1])
@pytest.mark.parametrize("i", CASES)
def test_rloo_equals_verl(case, i, group):
    x, verl = case
    c = x["cases"][i]
    mask = torch.tensor(c["mask"])
    ours = rloo_advantages(_t(c["scores01"]), group).double()[:, None] * mask
    _close(ours, verl["cases"][i][f"rloo/{group}"])


@pytest.mark.parametrize("i", CASES)
def test_dr_grpo_advantage_and_loss_equal_verl(case, i):
    x, verl = case
    c = x["cases"][i]
    mask = torch.tensor(c["mask"])
    adv = group_advantages(_t(c["scores01"]), GROUP, std_normalize=False).double()[:, None] * mask
    _close(adv, verl["cases"][i]["dr_grpo_adv"])
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_ratio_c": 3.0, "loss_agg": LossAgg.SEQ_MEAN_TOKEN_SUM_NORM}
    loss, st = policy_loss(_t(c["logp"]), _t(c["old_logp"]), _t(c["adv_token"]), mask, **kw)
    v = verl["cases"][i]["dr_grpo_loss"]
    _close(loss, v["loss"])
    _close(st.clip_fraction, v["clipfrac"])
    # the SPMD form: a global normaliser of sequences x horizon gives the same loss
    b, t = mask.shape
    _close(policy_loss(_t(c["logp"]), _t(c["old_logp"]), _t(c["adv_token"]), mask, normalizer=float(b * t),
                       **kw)[0], v["loss"])


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("i", CASES)
def test_reinforce_pp_equals_verl(case, i, gamma):
    x, verl = case
    c = x["cases"][i]
    _close(reinforce_pp_returns(_t(c["kl_rewards"]), torch.tensor(c["mask"]), gamma=gamma),
           verl["cases"][i][f"rpp/{gamma}"])


@pytest.mark.parametrize("agg", [LossAgg.SEQ_MEAN, LossAgg.TOKEN_MEAN])
@pytest.mark.parametrize("kind", ["token", "seq"])
@pytest.mark.parametrize("i", CASES)
def test_gspo_loss_and_gradient_equal_verl(case, i, kind, agg):
    x, verl = case
    c = x["cases"][i]
    logp = _t(c["gspo_logp"]).requires_grad_(True)
    adv = _t(c["adv_token"] if kind == "token" else c["adv_seq"])
    loss, st = gspo_loss(logp, _t(c["old_logp"]), adv, torch.tensor(c["mask"]), clip_low=GSPO_LOW,
                         clip_high=GSPO_HIGH, loss_agg=agg)
    loss.backward()
    v = verl["cases"][i][f"gspo/{kind}/{'seq-mean-token-mean' if agg == LossAgg.SEQ_MEAN else 'token-mean'}"]
    _close(loss, v["loss"])
    _close(st.clip_fraction, v["clipfrac"])
    _close(logp.grad, v["grad"])


def test_gspo_inputs_clip_some_sequences_and_not_others(case):
    _x, verl = case
    fracs = [v["clipfrac"] for r in verl["cases"] for k, v in r.items() if k.startswith("gspo/")]
    assert any(0 < f < 1 for f in fracs) and min(fracs) < max(fracs)


def test_overlong_penalty_equals_verl_dapo_rule(case):
    x, verl = case
    ours = overlong_penalty(torch.tensor(x["lengths"]), **OVERLONG)
    _close(ours, verl["overlong"])
    assert ours[: OVERLONG["max_len"] - OVERLONG["buffer"] + 1].eq(0).all() and ours[-1] == -OVERLONG["factor"]
