"""Our policy log-probs with a prompt's samples laid out once (posttrain.models.prompt_sharing, rl.share_prompt,
on by default) equal TRL 1.16.0's on the same model and rows: per-token log-probs at the sampling temperature,
their entropies, and the gradient of a weighted sum of the log-probs in every parameter.

TRL side, in a subprocess with TRL's folder on PYTHONPATH (as tests/unit/test_dense_losses_trl.py; trl is never
imported here): the model folder loaded with transformers, patched with trl's `add_fused_lm_head` (the head TRL's
GRPOTrainer scores with, temperature applied), and `GRPOTrainer._get_per_token_logps_and_entropies` on an
instance made with object.__new__, over TRL's own layout - prompts left-padded, completions right-padded, one row
per sample, no position ids (transformers counts positions from the first column, padding included; RoPE sees
only differences, so the values agree to float rounding). Ours: one row per distinct prompt, each response after
it under a 4D mask with its own positions. Same rows in both: three prompts of different lengths, a group of four
samples, a pair and one alone, responses of 1-5 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from posttrain.models.head_logprobs import response_logprobs
from tests.unit.test_dense_losses_trl import _trl_dir
from tests.unit.test_prompt_sharing import PROMPTS, RESPONSES, _llama

ROOT = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7

TRL_SCRIPT = r'''
import contextlib, json, sys
from types import SimpleNamespace
import torch
from transformers import AutoModelForCausalLM
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

x = json.load(sys.stdin)
model = AutoModelForCausalLM.from_pretrained(x["folder"], dtype=torch.float32, attn_implementation="sdpa")
add_fused_lm_head(model, temperature=x["temperature"], outputs=("log_probs", "entropy"))
P, R, pad = max(map(len, x["prompts"])), max(map(len, x["responses"])), x["pad"]
ids, att = [], []
for p, r in zip(x["prompts"], x["responses"]):
    ids.append([pad] * (P - len(p)) + p + r + [pad] * (R - len(r)))
    att.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
ids, att = torch.tensor(ids), torch.tensor(att)
trainer = object.__new__(GRPOTrainer)
trainer.accelerator = SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
logps, ent, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, R, compute_entropy=True)
keep = att[:, -R:].bool()
w = torch.tensor(x["weights"], dtype=torch.float32)[:, :R]
(logps * w * keep).sum().backward()
grads = {n: p.grad.flatten().tolist() for n, p in model.named_parameters() if p.grad is not None}
print(json.dumps({"logps": logps[keep].tolist(), "entropy": ent[keep].tolist(), "grads": grads}))
'''


def test_shared_prompt_logprobs_entropies_and_gradients_equal_trls(tmp_path):
    model = _llama()
    model.save_pretrained(tmp_path / "model")  # safetensors
    weights = torch.randn(len(PROMPTS), max(map(len, RESPONSES)), generator=torch.Generator().manual_seed(3))
    logp, ent, mask = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=TEMPERATURE, share_prompt=True)
    (logp * weights * mask).sum().backward()
    ours = {n: p.grad.flatten() for n, p in model.named_parameters() if p.grad is not None}

    x = {"folder": str(tmp_path / "model"), "prompts": PROMPTS, "responses": RESPONSES, "pad": 0,
         "temperature": TEMPERATURE, "weights": weights.tolist()}
    env = {**os.environ, "PYTHONPATH": str(_trl_dir()), "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", TRL_SCRIPT], input=json.dumps(x), env=env,
                       check=False, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])

    # the same tokens in the same (row-major) order on both sides
    assert len(theirs["logps"]) == int(mask.sum()) == sum(map(len, RESPONSES))
    assert torch.allclose(logp[mask].detach(), torch.tensor(theirs["logps"]), atol=1e-5)
    assert torch.allclose(ent[mask], torch.tensor(theirs["entropy"]), atol=1e-5)
    assert set(theirs["grads"]) == set(ours)
    for n, g in ours.items():
        assert torch.allclose(g, torch.tensor(theirs["grads"][n]), atol=1e-5, rtol=1e-4), n
    # the check has teeth: at another temperature TRL's values differ
    other, _, _ = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=1.0, share_prompt=True)
    assert not torch.allclose(other[mask].detach(), torch.tensor(theirs["logps"]), atol=1e-3)
