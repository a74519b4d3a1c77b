"""RL on a real pretrained model, as a user runs it: examples/own_model - the `pipeline` workflow (Flyte local
execution, real Ray) with sft.enabled=false straight from the SmolLM2-135M-Instruct folder, prompt/answer rows from
the example's jsonl files and its reward function from a folder of its own named as `module:function` - at tiny
size: two RL steps of 4 prompts x 2 samples with 16 new tokens, a few minutes on 2 cores. Marked `ray` (own pytest
process) and `real_model`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.ray, pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(1800)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model"
TINY = {"rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 16, "checkpoint_every": 0},
        "eval": {"num_problems": 4}}
"""What the test adds to the example's settings: two short RL steps, half the eval rows."""


def example_overrides(model_dir) -> dict:
    spec = importlib.util.spec_from_file_location("own_model_overrides", EXAMPLE / "overrides.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.overrides(model_dir)
    for section, values in TINY.items():
        out[section] = {**out.get(section, {}), **values}
    return out


def test_rl_from_the_real_model_folder_with_a_user_reward(tmp_path, monkeypatch, ray_local, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.artifacts import ArtifactStore
    from workflows.pipeline import pipeline

    home = tmp_path / "home"
    monkeypatch.setenv("POSTTRAIN_HOME", str(home))
    overrides = example_overrides(smollm2_dir)
    s = pipeline(recipe="small_instruct_cpu", overrides=json.dumps(overrides), run_id="real-rl")

    store = ArtifactStore(str(home))
    rl_model = store.manifest(s.rl_model_id)
    m = rl_model.metrics
    assert m["step"] == 2 and m["policy_version"] == 2, m
    assert m["reward_failures"] == 0 and m["num_samples"] == 8, m  # the user's function scored every sample
    assert 0.0 < m["reward_mean"] <= 2.0 and m["reward_std"] > 0, m
    assert rl_model.extra["reward"]["import_path"] == "numreward:number_then_brevity", rl_model.extra
    assert s.sft_model_id in rl_model.parents  # the base folder's artifact: SFT was skipped

    # The result is a plain HF folder: transformers loads it, and two updates moved the weights.
    folder = store.get(s.rl_model_id)
    tuned = AutoModelForCausalLM.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    moved = max(float((a - b).abs().max()) for a, b in zip(tuned.state_dict().values(), base.state_dict().values()))
    assert 0.0 < moved < 1e-2, moved  # lr 1e-6: a small, real change
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2? Answer with just the number."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = tuned.generate(**ids, max_new_tokens=16, do_sample=False)
    assert "4" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
