"""DPO, reward models and distillation on the SPMD trainer with real gloo process groups (ranks started as
torchrun starts them, forked warm: tests/ranks.py; the SIGKILL runs under torchrun itself), the same guarantees
SFT has: split invariance (1 rank x 4 micro-batches == 2 ranks x 2 == packed rows), FSDP2
equal to DDP, and an exact resume after SIGKILL. Pairs come through the real preference data path (a jsonl file
of prompt/chosen/rejected strings -> prepare_dataset)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from posttrain.config import DataConfig, DataSchema
from posttrain.data.examples import read_examples
from posttrain.data.prepare import prepare_dataset
from posttrain.models.io import load_tokenizer, save_model
from posttrain.models.tiny import build_model
from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
from tests.ranks import Ranks, run_ranks
from tests.torchrun_output import stderr_excerpt

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("dense_driver.py")
OBJECTIVES = ("dpo", "reward_model", "distill")


@pytest.fixture(scope="module")
def dense_data(tmp_path_factory):
    """Demonstrations (distillation), a preference dataset made from them (a correct answer chosen over one
    with its last digit changed), a tokenizer, and a frozen model folder (the DPO reference / the teacher)."""
    import dataclasses

    from tests.integration.dense_driver import MODEL

    d = tmp_path_factory.mktemp("dense")
    prepare_dataset(DataConfig(num_examples=600, eval_size=50, num_digits=2), d / "ds")
    train_tokenizer(tokenizer_training_texts(d / "ds"), 300, d / "tok")
    rows = []
    for ex in read_examples(d / "ds", "train"):
        good = ex["answer"]
        rows.append({"prompt": ex["messages"][0]["content"], "chosen": good,
                     "rejected": good[:-1] + str((int(good[-1]) + 3) % 10), "answer": good})
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_dataset(DataConfig(task="", files=[str(d / "pairs.jsonl")], schema=DataSchema.PREFERENCE, eval_size=20),
                    d / "pairs")
    tok = load_tokenizer(d / "tok")
    save_model(build_model(dataclasses.replace(MODEL, init_seed=1), tok), tok, d / "frozen")
    return d


def torchrun(nproc: int, *args, timeout=300) -> Ranks:
    """`nproc` ranks of a script, as torchrun starts them (forked warm: tests/ranks.py)."""
    p = run_ranks(nproc, *args, timeout=timeout)
    assert p.returncode == 0, stderr_excerpt(p.stderr)
    return p


def run_driver(tmp, d, objective, nproc, mode, micro, global_bs, steps, parallel="ddp", optimizer="adamw"):
    out = tmp / f"{objective}-{mode}-{nproc}x{micro}-{parallel}-{optimizer}"
    out.mkdir()
    data = d / ("ds" if objective == "distill" else "pairs")
    torchrun(nproc, DRIVER, out, data, d / "tok", d / "frozen", objective, mode, micro, global_bs, steps, parallel,
             optimizer)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return ranks, load_file(str(out / "weights.safetensors")), load_file(str(out / "init.safetensors"))


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_split_invariance_1x4_vs_2x2_and_packing(tmp_path, dense_data, objective):
    """Plain SGD (see dense_driver.py): the update is the gradient, so a normalisation off by any factor shows."""
    one, w1, w0 = run_driver(tmp_path, dense_data, objective, 1, "fixed", 4, 16, 2, optimizer="sgd")
    two, w2, _ = run_driver(tmp_path, dense_data, objective, 2, "fixed", 4, 16, 2, optimizer="sgd")  # 2 ranks x 2
    packed, wp, _ = run_driver(tmp_path, dense_data, objective, 2, "packed", 4, 16, 2, optimizer="sgd")
    assert one[0]["losses"][0] > 0 and one[0]["losses"][1] != one[0]["losses"][0]  # it trained
    update = max(float((w1[k] - w0[k]).abs().max()) for k in w1)
    assert update > 1e-4
    for other, w in ((two, w2), (packed, wp)):
        assert other[0]["losses"] == pytest.approx(one[0]["losses"], abs=1e-6)
        for m1, m2 in zip(one[0]["metrics"], other[0]["metrics"]):  # the logged statistics too (rewards, accuracy)
            assert m1.keys() == m2.keys() and m2 == pytest.approx(m1, abs=1e-5)
        assert _max_diff(w1, w) < 1e-4 * update  # the same update to a ten-thousandth of its largest element
    assert two[0]["checksum"] == two[1]["checksum"]


def test_dpo_fsdp2_matches_ddp(tmp_path, dense_data):
    ddp, wd, _ = run_driver(tmp_path, dense_data, "dpo", 2, "fixed", 4, 16, 3, "ddp")
    fsdp, wf, _ = run_driver(tmp_path, dense_data, "dpo", 2, "fixed", 4, 16, 3, "fsdp2")
    assert fsdp[0]["losses"] == pytest.approx(ddp[0]["losses"], abs=1e-5)
    assert _max_diff(wd, wf) < 1e-5


RUN = r"""
import sys
from pathlib import Path
from posttrain.config import DistillConfig, DPOConfig, RewardModelConfig, TrackingConfig
from posttrain.sft import run_sft
from tests.integration.dense_driver import MODEL
d, name, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
common = dict(steps=steps, global_batch_size=16, micro_batch_size=4, nproc=2, save_every=4, warmup_steps=2, lr=1e-2)
cfg = {"dpo": DPOConfig(**common), "reward_model": RewardModelConfig(**common),
       "distill": DistillConfig(teacher="t", **common)}[name]
run_sft(model_cfg=MODEL, sft_cfg=cfg, tracking_cfg=TrackingConfig(wandb=False, log_every=1),
        dataset_dir=d / ("ds" if name == "distill" else "pairs"), tokenizer_dir=d / "tok",
        base_model_dir=None, out_dir=Path(sys.argv[4]), state_dir=Path(sys.argv[5]), run_name="t",
        frozen_model_dir=None if name == "reward_model" else d / "frozen")
"""


# distill resumes as dpo does (a trainee beside a frozen model); reward_model's trainee has its own head
@pytest.mark.parametrize("objective", ("dpo", "reward_model"))
def test_resume_after_sigkill_gives_the_same_weights(tmp_path, dense_data, objective):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    torchrun(2, script, dense_data, objective, 16, tmp_path / "full", tmp_path / "state-full")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(dense_data), objective, "16", str(tmp_path / "resumed"), str(tmp_path / "state-kill")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                 "PYTHONPATH": str(ROOT)}, start_new_session=True)
    log = []
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stdout.readline()
        log.append(line)
        if line.startswith("step 8:") or not line:  # 8 steps done and saved (the log counts from 0)
            break
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank
    subprocess.run(["pkill", "-9", "-f", str(tmp_path / "state-kill")], check=False)
    proc.wait(30)
    time.sleep(1)
    # at ~20 steps/s a loaded machine's kill can land after the next save (12 steps; it replaces 8's folder)
    saved = sorted(p.name for p in (tmp_path / "state-kill").iterdir() if (p / "meta.json").exists())
    assert saved and saved[-1] in ("step-0000008", "step-0000012"), (saved, "".join(log))
    at = int(saved[-1].split("-")[1])
    assert not (tmp_path / "resumed").exists()
    p = torchrun(2, script, dense_data, objective, 16, tmp_path / "resumed", tmp_path / "state-kill")
    steps_logged = [int(ln.split(":")[0].split()[1]) for ln in p.stdout.splitlines() if ln.startswith("step ")]
    assert steps_logged[0] == at and steps_logged[-1] == 15  # resumed at the saved cursor; nothing repeated or lost
    assert f"{objective}: resuming at step {at} of saved state" in p.stdout
    name = "model.safetensors"
    a, b = load_file(str(tmp_path / "full" / name)), load_file(str(tmp_path / "resumed" / name))
    assert _max_diff(a, b) <= 1e-6
