"""LoRA on the SPMD dense trainer with real gloo process groups (ranks forked warm, tests/ranks.py): split invariance and
FSDP2 == DDP with only adapters training, an exact resume after SIGKILL whose saved state holds only the adapters,
DPO whose reference is the start model with its adapters off, and a reward model whose head trains beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.config import DataConfig, DataSchema, ModelConfig
from posttrain.data.examples import read_examples
from posttrain.data.prepare import prepare_dataset
from posttrain.models.io import load_tokenizer, save_model
from posttrain.models.tiny import build_model
from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
from tests.integration.test_sft_spmd import _max_diff, run_driver, torchrun, torchrun_killed_at

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "intermediate_size": 64, "max_seq_len": 32}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Demonstrations, preference pairs made from them, a tokenizer and a base model folder (random weights)."""
    d = tmp_path_factory.mktemp("lora-sft")
    prepare_dataset(DataConfig(num_examples=1200, eval_size=100, num_digits=2), d / "ds")
    train_tokenizer(tokenizer_training_texts(d / "ds"), 300, d / "tok")
    rows = [{"prompt": ex["messages"][0]["content"], "chosen": ex["answer"],
             "rejected": ex["answer"][:-1] + str((int(ex["answer"][-1]) + 3) % 10)}
            for ex in read_examples(d / "ds", "train")]
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_dataset(DataConfig(task="", files=[str(d / "pairs.jsonl")], schema=DataSchema.PREFERENCE, eval_size=20,
                               answer_field=""), d / "pairs")
    tok = load_tokenizer(d / "tok")
    save_model(build_model(ModelConfig(**MODEL), tok), tok, d / "base")
    return d


def test_lora_split_invariance_and_fsdp2_equal_ddp(tmp_path, data):
    one, w1 = run_driver(tmp_path, data, 1, "fixed", 4, 16, 2, "ddp", "lora")
    two, w2 = run_driver(tmp_path, data, 2, "fixed", 4, 16, 2, "ddp", "lora")
    fsdp, wf = run_driver(tmp_path, data, 2, "fixed", 4, 16, 2, "fsdp2", "lora")
    full, _ = run_driver(tmp_path, data, 1, "fixed", 4, 16, 2, "ddp", "")
    assert one[0]["losses"] == pytest.approx(two[0]["losses"], abs=1e-5)
    assert fsdp[0]["losses"] == pytest.approx(two[0]["losses"], abs=1e-5)
    assert _max_diff(w1, w2) < 1e-5 and _max_diff(w1, wf) < 1e-5
    assert one[0]["losses"][0] == pytest.approx(full[0]["losses"][0], abs=1e-6)  # B = 0: the base's first loss
    assert one[0]["losses"][1] != pytest.approx(full[0]["losses"][1], abs=1e-4)  # ... then a different update
    init = _init(data)
    base = {k.replace(".base_layer.", "."): v for k, v in w1.items() if ".lora_" not in k}
    assert all(torch.equal(v, init[k]) for k, v in base.items())  # the frozen base did not move
    assert any(float(v.abs().max()) > 0 for k, v in w1.items() if ".lora_B." in k)  # the adapters moved


def _init(data) -> dict:
    tok = load_tokenizer(data / "tok")
    return build_model(ModelConfig(**MODEL), tok).state_dict()


RUN = r"""
import sys
from pathlib import Path
from posttrain.config import DPOConfig, LoraConfig, ModelConfig, RewardModelConfig, SFTConfig, TrackingConfig
from posttrain.sft import run_sft
d, objective, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cls = {"sft": SFTConfig, "dpo": DPOConfig, "reward_model": RewardModelConfig}[objective]
cfg = cls(steps=steps, global_batch_size=16, micro_batch_size=4, nproc=int(sys.argv[6]), save_every=4,
          warmup_steps=2, lr=1e-2)
run_sft(model_cfg=ModelConfig(**MODEL_JSON, lora=LoraConfig(rank=4, alpha=8.0)), sft_cfg=cfg,
        tracking_cfg=TrackingConfig(wandb=False, log_every=1), dataset_dir=d / ("ds" if objective == "sft" else "pairs"),
        tokenizer_dir=d / "tok", base_model_dir=d / "base", out_dir=Path(sys.argv[4]), state_dir=Path(sys.argv[5]),
        run_name="t", frozen_model_dir=d / "base" if objective == "dpo" else None)
""".replace("MODEL_JSON", repr(MODEL))


def test_lora_sft_resumes_exactly_after_sigkill_from_adapter_only_state(tmp_path, data):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    torchrun(2, script, data, "sft", 24, tmp_path / "full", tmp_path / "state-full", 2)
    log = torchrun_killed_at(2, ["step 8:"], script, data, "sft", 24, tmp_path / "resumed", tmp_path / "state-kill",
                             2, kill_pattern=str(tmp_path / "state-kill"))  # 8 steps done and saved (0-based log)
    # at ~20 steps/s a loaded machine's kill can land after the next save (12 steps; it replaces 8's folder)
    committed = sorted(p for p in (tmp_path / "state-kill").iterdir() if (p / "meta.json").exists())
    assert committed and committed[-1].name in ("step-0000008", "step-0000012"), (committed, "".join(log))
    saved = committed[-1]
    from torch.distributed.checkpoint import FileSystemReader

    keys = [k for k in FileSystemReader(str(saved)).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys), keys  # the frozen base is not state
    p = torchrun(2, script, data, "sft", 24, tmp_path / "resumed", tmp_path / "state-kill", 2)
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("sft: resuming")] == [
        f"sft: resuming at step {int(saved.name.split('-')[1])} of saved state {saved}"], p.stdout
    for out in ("full", "resumed"):  # the artifact folder: peft's adapter files and the tokenizer, no full weights
        names = {f.name for f in (tmp_path / out).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
        assert not any(n.startswith("model") and n.endswith(".safetensors") for n in names)
    a = load_file(str(tmp_path / "full" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and _max_diff(a, b) <= 1e-6


def test_lora_dpo_reference_is_the_base_with_adapters_off(tmp_path, data):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    p = torchrun(1, script, data, "dpo", 6, tmp_path / "out", tmp_path / "state", 1)
    assert "dpo: reference = the start model with its LoRA adapters off (no second copy)" in p.stdout
    steps = [dict(kv.split("=") for kv in ln.split(" | ")[0].split()[2:]) for ln in p.stdout.splitlines()
             if ln.startswith("step ")]
    assert len(steps) == 6
    # policy == reference at the start (B = 0): both implicit rewards exactly 0, the loss ln 2
    assert steps[0]["rewards/chosen"] == steps[0]["rewards/rejected"] == "0" and steps[0]["loss"] == "0.6931"
    # then the adapters move the policy away from the reference, which stays the base: nonzero log-ratios
    assert all(float(s["rewards/chosen"]) != 0 for s in steps[1:])


def test_lora_reward_model_trains_its_head_and_merges(tmp_path, data):
    from posttrain.models.folders import write_merged
    from posttrain.models.lora import read_adapter

    script = tmp_path / "run.py"
    script.write_text(RUN)
    torchrun(1, script, data, "reward_model", 4, tmp_path / "out", tmp_path / "state", 1)
    _, tensors, extra = read_adapter(tmp_path / "out")
    assert extra == ("score",) and "score.weight" in tensors
    write_merged(data / "base", tmp_path / "out", tmp_path / "merged", reward_model=True)
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert torch.equal(merged["score.weight"], tensors["score.weight"])
