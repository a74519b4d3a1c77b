"""Our PPO math (posttrain.rl.algorithms.ppo, grpo.policy_loss's dual-clip) equals verl 0.9.1's on fixed seeded
inputs, within 1e-6.

verl is not in the project's venv: it is pip-installed --no-deps, with the few packages its import of
verl.trainer.ppo.core_algos needs and .venv lacks (VERL_PINS: omegaconf + its antlr4 runtime, tensordict + its
pyvers, codetiming, orjson; torch, numpy, transformers, ray, ... come from .venv), into
$POSTTRAIN_BENCH_CACHE or ~/.cache/posttrain/bench/verl, folder verl-0.9.1 (once, a few seconds). A subprocess of
.venv/bin/python with that folder on PYTHONPATH imports the real modules and computes verl's results; verl is
never imported here. Inputs are float64 and go to the subprocess as JSON, so both sides see the same numbers.

What is compared, verl side (real functions unless said otherwise):
- core_algos.compute_gae_advantage_return: advantages (whitened) and returns at EVERY position, masked ones
  included; right-padded masks (one sequence of length 1, one of full length) and a multi-turn-like mask with
  holes inside the response, which verl's recursion steps over; gamma in (1, 0.99) x lam in (1, 0.95).
- core_algos.compute_value_loss, token-mean, cliprange_value 0.2 and 0.5: loss and clip fraction.
- core_algos.compute_policy_loss_vanilla with an OmegaConf config (clip_ratio_low 0.2, clip_ratio_high 0.28,
  clip_ratio_c 3), token-level and sequence-level advantages of both signs, log-ratios up to +-3 (far outside the
  clip range, inside verl's +-20 clamp, which ours lacks), "token-mean" and "seq-mean-token-mean": loss,
  pg_clipfrac and pg_clipfrac_lower.
- token rewards: verl's reward managers place the score with
  reward_loop.reward_manager.base.RewardManagerBase.assemble_rm_scores (at attention-valid response length - 1,
  as a float32 tensor: the scores are float32-representable here); the KL penalty in the reward is
  ray_trainer.apply_kl_penalty, kl_penalty "kl" (k1) and "low_var_kl" (k3), FixedKLController(0.05). Importing
  ray_trainer pulls torchdata, peft, ... (peft releases that import with .venv's transformers are not pinned
  here), so that ONE function's source is taken from verl's installed ray_trainer.py with `ast` and executed with
  the real core_algos, masked_mean and DataProto; everything else is imported.
- metric_utils.compute_data_metrics's critic/vf_explained_var vs explained_variance.
Our advantages into policy_loss are float32-representable: policy_loss casts advantages to float32 (unchanged).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from posttrain.config import KLEstimator, LossAgg
from posttrain.rl.algorithms.grpo import kl_penalty, policy_loss
from posttrain.rl.algorithms.ppo import explained_variance, gae_advantages, token_rewards, value_loss
from tests.peer_install import install_no_deps

ROOT = Path(__file__).resolve().parents[2]
VERL_PINS = ("verl==0.9.1", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3", "tensordict==0.10.0",
             "pyvers==0.2.3", "codetiming==1.4.0", "orjson==3.13.0")
TOL = 1e-6
SEEDS = (0, 1, 2, 3)
GAMMAS = (1.0, 0.99)
LAMS = (1.0, 0.95)
VALUE_CLIPS = (0.2, 0.5)
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
KL_COEF = 0.05


def _verl_dir() -> Path:
    return install_no_deps("~/.cache/posttrain/bench/verl", "verl-0.9.1", VERL_PINS)


# Runs in the subprocess: reads the inputs as JSON on stdin, prints verl's results as JSON on stdout.
VERL_SCRIPT = r'''
import ast, json, os, sys
import torch
from omegaconf import OmegaConf
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.utils.torch_functional import masked_mean
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

src_path = os.path.join(os.path.dirname(verl.__file__), "trainer", "ppo", "ray_trainer.py")
tree = ast.parse(open(src_path).read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_kl_penalty")
ns = {"torch": torch, "core_algos": core_algos, "masked_mean": masked_mean, "DataProto": DataProto}
exec(compile(ast.Module(body=[fn], type_ignores=[]), src_path, "exec"), ns)
apply_kl_penalty = ns["apply_kl_penalty"]

x = json.load(sys.stdin)
T = lambda v: torch.tensor(v, dtype=torch.float64)
out = []
for c in x["cases"]:
    mask = torch.tensor(c["mask"], dtype=torch.int64)
    rewards, values, returns = T(c["rewards"]), T(c["values"]), T(c["returns"])
    r = {"gae": {}, "value": {}, "policy": {}, "rewards": {}}
    for gamma in x["gammas"]:
        for lam in x["lams"]:
            adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
            r["gae"][f"{gamma}/{lam}"] = {"advantages": adv.tolist(), "returns": ret.tolist()}
    for clip in x["value_clips"]:
        loss, frac = core_algos.compute_value_loss(T(c["vpreds"]), returns, values, mask, clip)
        r["value"][str(clip)] = {"loss": float(loss), "clipfrac": float(frac)}
    cfg = OmegaConf.create({"clip_ratio": x["clip_low"], "clip_ratio_low": x["clip_low"],
                            "clip_ratio_high": x["clip_high"], "clip_ratio_c": x["clip_c"], "global_batch_info": {}})
    b, t = mask.shape
    for kind in ("token", "seq"):
        adv = T(c["adv_token"]) if kind == "token" else T(c["adv_seq"])[:, None].expand(b, t)
        for agg in ("token-mean", "seq-mean-token-mean"):
            loss, m = core_algos.compute_policy_loss_vanilla(T(c["old_logp"]), T(c["logp"]), adv, mask, agg, cfg)
            r["policy"][f"{kind}/{agg}"] = {"loss": float(loss), "clipfrac": m["actor/pg_clipfrac"],
                                            "clipfrac_lower": m["actor/pg_clipfrac_lower"]}
    if c["right_padded"]:
        p = 3
        data = DataProto.from_dict(tensors={
            "prompts": torch.zeros(b, p, dtype=torch.int64), "responses": torch.zeros(b, t, dtype=torch.int64),
            "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.int64), mask], dim=1)})
        scores = RewardManagerBase.assemble_rm_scores(data, c["scores"]).double()
        r["rewards"]["none"] = scores.tolist()
        for name in ("kl", "low_var_kl"):
            d = DataProto.from_dict(tensors={"token_level_scores": scores, "response_mask": mask,
                                             "old_log_probs": T(c["old_logp"]), "ref_log_prob": T(c["ref_logp"])})
            d, _ = apply_kl_penalty(d, core_algos.FixedKLController(x["kl_coef"]), kl_penalty=name)
            r["rewards"][name] = d.batch["token_level_rewards"].tolist()
        adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, 1.0, 1.0)
        metrics = compute_data_metrics(DataProto.from_dict(tensors={
            "token_level_scores": scores, "token_level_rewards": scores, "advantages": adv, "returns": returns,
            "values": values, "prompts": data.batch["prompts"], "responses": data.batch["responses"],
            "attention_mask": data.batch["attention_mask"], "response_mask": mask}), use_critic=True)
        r["explained_var"] = metrics["critic/vf_explained_var"]
    out.append(r)
print(json.dumps(out))
'''


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().double()


def _case(seed: int, holes: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(4, 9, (1,), generator=g))
    t = int(torch.randint(5, 13, (1,), generator=g))
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0], lengths[1] = 1, t  # a length-1 sequence and a full one
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    if holes:  # multi-turn-like: observation tokens (mask 0) inside responses
        mask[1, 1:3] = 0
        mask[2:, 1] = mask[2:, 1] * (torch.rand(b - 2, generator=g) < 0.5).long()
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    old = rnd(b, t) - 1.0
    values = rnd(b, t)
    return {"right_padded": not holes, "mask": mask.tolist(),
            "rewards": (rnd(b, t) * 0.5).tolist(), "values": values.tolist(),
            "returns": (values + rnd(b, t)).tolist(), "vpreds": (values + rnd(b, t) * 0.6).tolist(),
            "old_logp": old.tolist(), "logp": (old + (torch.rand(b, t, generator=g) * 6 - 3)).tolist(),
            "ref_logp": (old + rnd(b, t) * 0.3).tolist(),
            "adv_token": _f32(rnd(b, t) * 2).tolist(), "adv_seq": _f32(rnd(b) * 2).tolist(),
            "scores": _f32(rnd(b)).tolist()}


def _inputs() -> dict:
    return {"cases": [_case(s) for s in SEEDS] + [_case(10, holes=True), _case(11, holes=True)],
            "gammas": list(GAMMAS), "lams": list(LAMS), "value_clips": list(VALUE_CLIPS), "clip_low": CLIP_LOW,
            "clip_high": CLIP_HIGH, "clip_c": CLIP_C, "kl_coef": KL_COEF}


CASES = range(len(SEEDS) + 2)


def run_verl(script: str, inputs: dict):
    """`script` run by .venv's python with verl's folder on its path, `inputs` as JSON on stdin; its last stdout
    line, parsed as JSON."""
    env = {**os.environ, "PYTHONPATH": str(_verl_dir()), "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", script], input=json.dumps(inputs), env=env,
                       check=False, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def case() -> tuple[dict, list]:
    x = _inputs()
    return x, run_verl(VERL_SCRIPT, x)


def _close(ours, theirs, tol: float = TOL) -> None:
    ours_t = torch.as_tensor(ours, dtype=torch.float64)
    theirs_t = torch.as_tensor(theirs, dtype=torch.float64)
    assert ours_t.shape == theirs_t.shape
    assert torch.allclose(ours_t, theirs_t, rtol=0, atol=tol), (ours_t, theirs_t, (ours_t - theirs_t).abs().max())


def _t(v) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("i", CASES)
def test_gae_equals_verl(case, i, gamma, lam):
    x, verl = case
    c = x["cases"][i]
    adv, ret = gae_advantages(_t(c["rewards"]), _t(c["values"]), torch.tensor(c["mask"]), gamma=gamma, lam=lam)
    v = verl[i]["gae"][f"{gamma}/{lam}"]
    _close(adv, v["advantages"])  # every position, masked ones too
    _close(ret, v["returns"])


@pytest.mark.parametrize("clip", VALUE_CLIPS)
@pytest.mark.parametrize("i", CASES)
def test_value_loss_equals_verl(case, i, clip):
    x, verl = case
    c = x["cases"][i]
    mask = torch.tensor(c["mask"])
    loss, st = value_loss(_t(c["vpreds"]), _t(c["values"]), _t(c["returns"]), mask, clip_range=clip)
    v = verl[i]["value"][str(clip)]
    _close(loss, v["loss"])
    _close(st.vf_loss, v["loss"])
    _close(st.clip_fraction, v["clipfrac"])
    assert 0 < st.clip_fraction < 1  # both branches are exercised
    # a global normalizer equal to this batch's token count is the same token mean
    _close(value_loss(_t(c["vpreds"]), _t(c["values"]), _t(c["returns"]), mask, clip_range=clip,
                      normalizer=float(mask.sum()))[0], v["loss"])


@pytest.mark.parametrize("agg", [LossAgg.TOKEN_MEAN, LossAgg.SEQ_MEAN])
@pytest.mark.parametrize("kind", ["token", "seq"])
@pytest.mark.parametrize("i", CASES)
def test_dual_clip_policy_loss_equals_verl(case, i, kind, agg):
    x, verl = case
    c = x["cases"][i]
    mask = torch.tensor(c["mask"])
    adv = _t(c["adv_token"] if kind == "token" else c["adv_seq"])
    kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "loss_agg": agg}
    loss, st = policy_loss(_t(c["logp"]), _t(c["old_logp"]), adv, mask, clip_ratio_c=CLIP_C, **kw)
    v = verl[i]["policy"][f"{kind}/{'token-mean' if agg == LossAgg.TOKEN_MEAN else 'seq-mean-token-mean'}"]
    _close(loss, v["loss"])
    _close(st.clip_fraction, v["clipfrac"])
    _close(st.clip_fraction_lower, v["clipfrac_lower"])
    # None is today's behaviour, bit for bit (and differs from dual-clip on these inputs)
    plain, plain_st = policy_loss(_t(c["logp"]), _t(c["old_logp"]), adv, mask, **kw)
    none, none_st = policy_loss(_t(c["logp"]), _t(c["old_logp"]), adv, mask, clip_ratio_c=None, **kw)
    assert torch.equal(plain, none) and plain_st == none_st and none_st.clip_fraction_lower == 0.0


def test_inputs_exercise_the_dual_clip(case):
    _x, verl = case
    assert all(max(v["clipfrac_lower"] for v in r["policy"].values()) > 0 for r in verl)  # every case binds
    assert all(any(r["policy"][k]["clipfrac_lower"] > 0 for r in verl) for k in verl[0]["policy"])
    assert all(0 < v["clipfrac"] < 1 for r in verl for v in r["policy"].values())


@pytest.mark.parametrize("i", range(len(SEEDS)))
def test_token_rewards_equal_verl_scores_and_kl_penalty(case, i):
    x, verl = case
    c = x["cases"][i]
    mask = torch.tensor(c["mask"])
    scores = _t(c["scores"])
    _close(token_rewards(scores, mask), verl[i]["rewards"]["none"])
    logp, ref = _t(c["old_logp"]), _t(c["ref_logp"])
    for name, est in (("kl", KLEstimator.K1), ("low_var_kl", KLEstimator.K3)):
        ours = token_rewards(scores, mask, kl=kl_penalty(logp, ref, est), kl_coef=KL_COEF)
        _close(ours, verl[i]["rewards"][name])


@pytest.mark.parametrize("i", range(len(SEEDS)))
def test_explained_variance_equals_verl_metric(case, i):
    x, verl = case
    c = x["cases"][i]
    ours = explained_variance(_t(c["values"]), _t(c["returns"]), torch.tensor(c["mask"]))
    _close(ours, verl[i]["explained_var"])
