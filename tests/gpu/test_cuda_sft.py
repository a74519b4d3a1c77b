"""GPU path: SFT with NCCL (world size 1: NCCL refuses two ranks on one GPU) and bf16 autocast, then evaluation
on CUDA; on a GPU it must learn (greedy >= 0.6). The same script runs on the CPU (gloo, fp32, 20 steps, GPUs
hidden) in every `make test`, so the GPU path's calls cannot drift from the code unnoticed; nothing in CI
depends on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu,
                                                  pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from pathlib import Path
from posttrain.config import Backend, DataConfig, DType, EvalConfig, ModelConfig, SFTConfig, TrackingConfig
from posttrain.data.prepare import prepare_dataset
from posttrain.eval import evaluate
from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
from posttrain.sft import run_sft
d, CUDA = Path(sys.argv[1]), sys.argv[2] == "cuda"
prepare_dataset(DataConfig(num_examples=12000, num_digits=2, eval_size=500), d / "ds")
train_tokenizer(tokenizer_training_texts(d / "ds"), 300, d / "tok")
m = run_sft(model_cfg=ModelConfig(max_seq_len=32, dtype=DType.BF16 if CUDA else DType.FP32),
            sft_cfg=SFTConfig(steps=600 if CUDA else 20, global_batch_size=256, micro_batch_size=256, nproc=1,
                              backend=Backend.NCCL if CUDA else Backend.GLOO, save_every=0),
            tracking_cfg=TrackingConfig(wandb=False, log_every=100), dataset_dir=d / "ds",
            tokenizer_dir=d / "tok", base_model_dir=None, out_dir=d / "model", state_dir=d / "state")
r = evaluate(d / "model", d / "ds", EvalConfig(num_problems=500, k=4, max_new_tokens=6), device="cuda" if CUDA else "cpu")
print("RESULT", m["tokens_per_s"], r.greedy_accuracy, r.generated_tokens_per_s)
"""


@pytest.mark.timeout(700)
@pytest.mark.parametrize("device", DEVICES)
def test_cuda_sft_with_nccl_and_bf16_learns(tmp_path, device):
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), device], capture_output=True, text=True,
                       check=False, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    tokens_per_s, acc, gen_tps = map(float, p.stdout.split("RESULT")[1].split())
    print(f"{device} sft tokens/s {tokens_per_s:.0f}, greedy {acc:.3f}, eval generation tokens/s {gen_tps:.0f}")
    assert tokens_per_s > 0 and 0.0 <= acc <= 1.0 and gen_tps > 0
    if device == "cuda":
        assert acc >= 0.6
