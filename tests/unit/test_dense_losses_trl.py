"""Our dense losses (posttrain.sft.losses) equal TRL 1.16.0's on fixed seeded inputs, within 1e-6.

TRL is not in the project's venv: it is pip-installed (--no-deps, TRL's other requirements are in .venv) into the
folder bench/rl_vs_trl.py uses (~/.cache/posttrain/bench/rl-trl/trl-1.16.0-1.15.0-7.2.2, once), and a
subprocess of .venv/bin/python with that folder on PYTHONPATH computes TRL's losses; trl is never imported here.
Inputs are float64 and go to the subprocess as JSON, so both sides see the same numbers.

What is compared, TRL side (none of it trains or even builds a model):
- DPOTrainer._compute_loss, on an instance made with object.__new__ plus the attributes it reads, a fake
  model that returns the per-token log-probs (zero outside the completion, as TRL's fused LM head returns them
  for labels -100) and precomputed reference log-probs (precompute_ref_logps=True). One call per pair gives the
  per-pair losses and the logged rewards/chosen, rewards/rejected; one call on the whole batch gives the mean.
  loss_type "sigmoid"; "ipo" (TRL divides chosen/rejected log-ratios by each completion's token count: the
  token-mean log-probs we ask the caller for); label smoothing: TRL 1.16's "sigmoid" IGNORES label_smoothing
  (its docs say it is used by robust and EXO only). The conservative-DPO formula ours implements,
  -(1-ls) logsigmoid(beta m) - ls logsigmoid(-beta m), is in TRL 1.16 only inside "aot_unpaired", which sorts
  the chosen and rejected log-ratios over the batch first: with a batch of ONE pair the sort is the identity, so
  per-pair "aot_unpaired" calls are exactly label-smoothed sigmoid DPO.
  RPO: TRL 1.16 has no rpo_alpha; RPO is loss_type ["sigmoid", "sft"] with loss_weights [1, alpha], where "sft"
  is -mean of the chosen completions' per-token log-probs over all chosen tokens of the batch. Our trainer adds
  sft_weight * (chosen-token NLL summed / chosen-token count) to mean(dpo_losses): the same number.
- RewardTrainer.compute_loss (object.__new__, fake model returning logits (2N, 1) = [chosen; rejected]):
  mean(-logsigmoid(r_c - r_r)) + center_rewards_coefficient * mean((r_c + r_r)^2) == mean of ours.
- trl.experimental.gkd.GKDTrainer.generalized_jsd_loss (staticmethod), reduction="none" summed over the vocab
  (per token), and "batchmean" with labels (sum over valid tokens / their count == mean of our per-token
  losses; without labels "batchmean" divides by the batch size, not the token count). Convention: F.kl_div
  argument order makes beta=0 forward KL(teacher||student), beta=1 reverse KL(student||teacher), and in between
  M = beta teacher + (1 - beta) student, loss = beta KL(teacher||M) + (1-beta) KL(student||M): ours.
  Note GKDTrainer.compute_loss never passes temperature (its config's temperature is for sampling), so TRL's
  GKD trains at temperature 1 whatever it samples with; the staticmethod takes it and we compare at 1 and 2.
- trl.trainer.distillation_trainer._chunked_divergence_loss (TRL 1.16's non-experimental DistillationTrainer;
  same beta convention, with temperature), through an identity lm_head so hidden states are the logits. It
  computes in float32, so that comparison uses float32 logits.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from posttrain.config import DistillLoss, DPOLoss
from posttrain.sft.losses import bradley_terry_losses, distill_token_losses, dpo_losses
from tests.peer_install import install_no_deps

ROOT = Path(__file__).resolve().parents[2]
TRL_PINS = ("trl==1.16.0", "accelerate==1.15.0", "psutil==7.2.2")  # as bench/rl_vs_trl.py
TOL = 1e-6
BETAS = (0.1, 0.5)
JSD_BETAS = (0.0, 0.3, 0.5, 1.0)
TEMPERATURES = (1.0, 2.0)


def _trl_dir() -> Path:
    """bench/rl_vs_trl.py's install_trl folder, without importing bench (it pulls in the project's stages)."""
    return install_no_deps("~/.cache/posttrain/bench/rl-trl", "trl-" + "-".join(p.split("==")[1] for p in TRL_PINS), TRL_PINS)


# Runs in the subprocess: reads the inputs as JSON on stdin, prints TRL's results as JSON on stdout.
TRL_SCRIPT = r'''
import json, sys
from collections import defaultdict
from types import SimpleNamespace
import torch
from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.reward_trainer import RewardTrainer
from trl.experimental.gkd import GKDTrainer
from trl.trainer.distillation_trainer import _chunked_divergence_loss

x = json.load(sys.stdin)
T = lambda v: torch.tensor(v, dtype=torch.float64)
acc = SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t)

def trainer(cls, **attrs):
    t = object.__new__(cls)
    t.__dict__.update(model=SimpleNamespace(training=True), accelerator=acc, _metrics={"train": defaultdict(list)},
                      _total_train_tokens=0, _tp_size=1, **attrs)
    return t

class FakeLM:  # what DPOTrainer reads from the fused-LM-head output, for [chosen; rejected] rows
    def __init__(self, logps):
        self.logps = logps
    def __call__(self, **kw):
        z = torch.zeros_like(self.logps)
        return SimpleNamespace(log_probs=self.logps, entropy=z, mean_logits=z, is_top1=z.bool())

def dpo(idx, loss_types, weights, beta, ls):
    d = x["dpo"]
    mask = torch.tensor(d["completion_mask"])  # (2N, L): chosen rows then rejected rows
    logps = T(d["token_logps"])  # (2N, L - 1), 0 outside the completion
    n = len(d["ref_chosen"])
    rows = idx + [i + n for i in idx]
    t = trainer(DPOTrainer, beta=beta, loss_types=loss_types, loss_weights=weights, label_smoothing=ls,
                ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl", use_weighting=False,
                aux_loss_enabled=False)
    inputs = {"input_ids": torch.zeros_like(mask[rows]), "attention_mask": torch.ones_like(mask[rows]),
              "completion_mask": mask[rows], "ref_chosen_logps": T(d["ref_chosen"])[idx],
              "ref_rejected_logps": T(d["ref_rejected"])[idx]}
    loss = t._compute_loss(FakeLM(logps[rows]), inputs, return_outputs=False)
    m = t._metrics["train"]
    return float(loss), m["rewards/chosen"][0], m["rewards/rejected"][0]

out = {"dpo": {}}
n = len(x["dpo"]["ref_chosen"])
for beta in x["betas"]:
    for name, types, weights, ls in [("sigmoid", ["sigmoid"], [1.0], 0.0),
                                     ("sigmoid_ls_ignored", ["sigmoid"], [1.0], 0.2),
                                     ("cdpo", ["aot_unpaired"], [1.0], 0.2),
                                     ("ipo", ["ipo"], [1.0], 0.0),
                                     ("rpo", ["sigmoid", "sft"], [1.0, x["rpo_alpha"]], 0.0)]:
        per = [dpo([i], types, weights, beta, ls) for i in range(n)]
        out["dpo"][f"{name}/{beta}"] = {"per_pair": [p[0] for p in per], "chosen": [p[1] for p in per],
                                        "rejected": [p[2] for p in per],
                                        "batch": dpo(list(range(n)), types, weights, beta, ls)[0]}

rc, rr = T(x["bt"]["chosen"]), T(x["bt"]["rejected"])
out["bt"] = {}
for coef in x["center_coefs"]:
    def rm(i):
        t = trainer(RewardTrainer, args=SimpleNamespace(center_rewards_coefficient=coef))
        logits = torch.cat([rc[i], rr[i]])[:, None]
        model = lambda **kw: SimpleNamespace(logits=logits)
        return float(t.compute_loss(model, {"input_ids": torch.zeros(2 * len(i), 3, dtype=torch.long),
                                            "attention_mask": torch.ones(2 * len(i), 3, dtype=torch.long)}))
    out["bt"][str(coef)] = {"per_pair": [rm([i]) for i in range(len(rc))], "batch": rm(list(range(len(rc))))}

s, te = T(x["kd"]["student"]), T(x["kd"]["teacher"])  # (B, L, V)
labels = torch.tensor(x["kd"]["labels"])  # (B, L)
out["gkd"], out["dist"] = {}, {}
for beta in x["jsd_betas"]:
    for temp in x["temperatures"]:
        key = f"{beta}/{temp}"
        none = GKDTrainer.generalized_jsd_loss(s, te, beta=beta, temperature=temp, reduction="none")
        mean = GKDTrainer.generalized_jsd_loss(s, te, labels=labels, beta=beta, temperature=temp)
        out["gkd"][key] = {"per_token": none.sum(-1).flatten().tolist(), "batchmean": float(mean)}
        v = s.shape[-1]
        eye = torch.eye(v, dtype=torch.float32)
        loss, _, _ = _chunked_divergence_loss(s.float(), te.float(), eye, eye, (labels != -100).long(), beta,
                                              temperature=temp)
        out["dist"][key] = float(loss)
print(json.dumps(out))
'''


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    n, length = 5, 9
    mask = torch.zeros(2 * n, length, dtype=torch.long)  # prompt, then completion, then padding
    for i in range(2 * n):
        p = int(torch.randint(1, 4, (1,), generator=g))
        c = int(torch.randint(1, length - p + 1, (1,), generator=g))
        mask[i, p:p + c] = 1
    token_logps = -torch.rand(2 * n, length - 1, generator=g, dtype=torch.float64) * 3 * mask[:, 1:]
    b, seq, v = 3, 4, 11
    labels = torch.randint(0, v, (b, seq), generator=g)
    labels[0, :2] = labels[2, 3] = -100
    student = torch.randn(b, seq, v, generator=g, dtype=torch.float64) * 2
    teacher = torch.randn(b, seq, v, generator=g, dtype=torch.float64) * 2
    return {"betas": list(BETAS), "rpo_alpha": 0.7, "center_coefs": [0.0, 0.01, 0.5],
            "jsd_betas": list(JSD_BETAS), "temperatures": list(TEMPERATURES),
            "dpo": {"completion_mask": mask.tolist(), "token_logps": token_logps.tolist(),
                    "ref_chosen": (token_logps[:n].sum(1) + torch.randn(n, generator=g, dtype=torch.float64)).tolist(),
                    "ref_rejected": (token_logps[n:].sum(1)
                                     + torch.randn(n, generator=g, dtype=torch.float64)).tolist()},
            "bt": {"chosen": (torch.randn(6, generator=g, dtype=torch.float64) * 2).tolist(),
                   "rejected": (torch.randn(6, generator=g, dtype=torch.float64) * 2).tolist()},
            "kd": {"student": student.tolist(), "teacher": teacher.tolist(), "labels": labels.tolist()}}


@pytest.fixture(scope="module")
def case() -> tuple[dict, dict]:
    site = _trl_dir()
    x = _inputs()
    env = {**os.environ, "PYTHONPATH": str(site), "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", TRL_SCRIPT], input=json.dumps(x), env=env,
                       check=False, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return x, json.loads(r.stdout.strip().splitlines()[-1])


def _close(ours: torch.Tensor | float, theirs, tol: float = TOL) -> None:
    ours_t = torch.as_tensor(ours, dtype=torch.float64)
    theirs_t = torch.as_tensor(theirs, dtype=torch.float64)
    assert ours_t.shape == theirs_t.shape
    assert torch.allclose(ours_t, theirs_t, rtol=0, atol=tol), (ours_t, theirs_t, (ours_t - theirs_t).abs().max())


def _dpo_inputs(x: dict) -> tuple[torch.Tensor, ...]:
    """(summed policy chosen, rejected, token counts chosen, rejected, ref chosen, ref rejected), each (N,)."""
    d = x["dpo"]
    logps = torch.tensor(d["token_logps"], dtype=torch.float64)  # (2N, L - 1)
    counts = torch.tensor(d["completion_mask"], dtype=torch.float64).sum(1)  # (2N,)
    n = logps.shape[0] // 2
    sums = logps.sum(1)
    return (sums[:n], sums[n:], counts[:n], counts[n:], torch.tensor(d["ref_chosen"], dtype=torch.float64),
            torch.tensor(d["ref_rejected"], dtype=torch.float64))


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_sigmoid_and_rewards(case, beta):
    x, trl = case
    pc, pr, _, _, rc, rr = _dpo_inputs(x)
    losses, chosen, rejected = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID)
    t = trl["dpo"][f"sigmoid/{beta}"]
    _close(losses, t["per_pair"])
    _close(losses.mean(), t["batch"])
    _close(chosen, t["chosen"])
    _close(rejected, t["rejected"])


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_label_smoothing_is_trl_aot_unpaired_per_pair(case, beta):
    x, trl = case
    pc, pr, _, _, rc, rr = _dpo_inputs(x)
    losses, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID, label_smoothing=0.2)
    _close(losses, trl["dpo"][f"cdpo/{beta}"]["per_pair"])
    # TRL 1.16's "sigmoid" ignores label_smoothing: it equals our unsmoothed loss, not the smoothed one
    plain, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID)
    _close(plain, trl["dpo"][f"sigmoid_ls_ignored/{beta}"]["per_pair"])
    assert not torch.allclose(losses, plain)


@pytest.mark.parametrize("beta", BETAS)
def test_ipo_with_token_mean_logps(case, beta):
    x, trl = case
    pc, pr, nc, nr, rc, rr = _dpo_inputs(x)
    # TRL divides each log-ratio by its completion's token count; we take token-mean log-probs from the caller
    losses, _, _ = dpo_losses(pc / nc, pr / nr, rc / nc, rr / nr, beta=beta, loss=DPOLoss.IPO)
    t = trl["dpo"][f"ipo/{beta}"]
    _close(losses, t["per_pair"])
    _close(losses.mean(), t["batch"])
    # TRL logs IPO's rewards from the SUMMED log-ratios (beta * (policy - ref) before its length division)
    _, chosen, rejected = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.IPO)
    _close(chosen, t["chosen"])
    _close(rejected, t["rejected"])


@pytest.mark.parametrize("beta", BETAS)
def test_rpo_is_dpo_plus_weighted_chosen_token_nll(case, beta):
    x, trl = case
    pc, pr, _, _, rc, rr = _dpo_inputs(x)
    losses, _, _ = dpo_losses(pc, pr, rc, rr, beta=beta, loss=DPOLoss.SIGMOID)
    logps = torch.tensor(x["dpo"]["token_logps"], dtype=torch.float64)
    mask = torch.tensor(x["dpo"]["completion_mask"], dtype=torch.float64)[:, 1:]
    n = logps.shape[0] // 2
    nll = -(logps[:n] * mask[:n]).sum() / mask[:n].sum()  # what our trainer adds, times dpo.sft_weight
    _close(losses.mean() + x["rpo_alpha"] * nll, trl["dpo"][f"rpo/{beta}"]["batch"])
    for i in range(n):  # one pair: the NLL is that pair's chosen-token mean
        nll_i = -(logps[i] * mask[i]).sum() / mask[i].sum()
        _close(losses[i] + x["rpo_alpha"] * nll_i, trl["dpo"][f"rpo/{beta}"]["per_pair"][i])


@pytest.mark.parametrize("coef", [0.0, 0.01, 0.5])
def test_bradley_terry(case, coef):
    x, trl = case
    rc = torch.tensor(x["bt"]["chosen"], dtype=torch.float64)
    rr = torch.tensor(x["bt"]["rejected"], dtype=torch.float64)
    losses = bradley_terry_losses(rc, rr, center_rewards_coef=coef)
    _close(losses, trl["bt"][str(coef)]["per_pair"])
    _close(losses.mean(), trl["bt"][str(coef)]["batch"])


def _ours_distill(student: torch.Tensor, teacher: torch.Tensor, beta: float, temp: float) -> torch.Tensor:
    if beta == 0:
        return distill_token_losses(student, teacher, loss=DistillLoss.FORWARD_KL, temperature=temp)
    if beta == 1:
        return distill_token_losses(student, teacher, loss=DistillLoss.REVERSE_KL, temperature=temp)
    return distill_token_losses(student, teacher, loss=DistillLoss.JSD, beta=beta, temperature=temp)


@pytest.mark.parametrize("temp", TEMPERATURES)
@pytest.mark.parametrize("beta", JSD_BETAS)
def test_distill_equals_trl_gkd_and_distillation_trainer(case, beta, temp):
    x, trl = case
    student = torch.tensor(x["kd"]["student"], dtype=torch.float64)  # (B, L, V)
    teacher = torch.tensor(x["kd"]["teacher"], dtype=torch.float64)
    valid = torch.tensor(x["kd"]["labels"]) != -100  # (B, L)
    v = student.shape[-1]
    ours = _ours_distill(student.view(-1, v), teacher.view(-1, v), beta, temp)  # (B*L,)
    t = trl["gkd"][f"{beta}/{temp}"]
    _close(ours, t["per_token"])
    _close(ours[valid.view(-1)].mean(), t["batchmean"])
    # beta 0 / 1 through our JSD entry point read as TRL reads them
    _close(distill_token_losses(student.view(-1, v), teacher.view(-1, v), loss=DistillLoss.JSD, beta=beta,
                                temperature=temp), t["per_token"])
    # the DistillationTrainer's chunked kernel computes in float32: compare our float32 result
    ours32 = _ours_distill(student[valid].float(), teacher[valid].float(), beta, temp)  # (M,)
    _close(ours32.mean(), trl["dist"][f"{beta}/{temp}"])
