"""RL on a real pretrained model, as a user runs it: `pipeline` (Flyte local execution, real Ray) with
sft.enabled=false straight from the SmolLM2-135M-Instruct folder, prompt/answer rows from jsonl files and a
reward function from a folder of its own named as `module:function`. Two RL steps of 4 prompts x 2 samples
with 16 new tokens: a few minutes on 2 cores. Marked `ray` (own pytest process) and `real_model`."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.test_real_model import EVAL_PROBLEMS, REWARD_MODULE

# The number check plus a small bonus for brevity: samples of one prompt almost never tie, so GRPO's
# advantages are not all zero and two updates must move the weights (with the number check alone, 2 samples
# per prompt often score alike: measured, the weights then stay exactly the same).
SHAPED = REWARD_MODULE + '''

def number_then_brevity(completion, answer):
    return number_in_reply(completion, answer) + 1.0 / (1 + len(completion))
'''

pytestmark = [pytest.mark.ray, pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(1800)]

TRAIN_PROBLEMS = [("What is 8 + 2?", "10"), ("What is 2 * 10?", "20"), ("What is 6 + 7?", "13"),
                  ("What is 9 * 2?", "18"), ("What is 15 - 5?", "10"), ("What is 3 + 4?", "7"),
                  ("What is 6 * 6?", "36"), ("What is 20 - 8?", "12")]


def test_rl_from_the_real_model_folder_with_a_user_reward(tmp_path, monkeypatch, ray_local, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.artifacts import ArtifactStore
    from workflows.pipeline import pipeline

    def rows(problems):
        return "".join(json.dumps({"prompt": f"{q} Answer with just the number.", "answer": a}) + "\n"
                       for q, a in problems)

    (tmp_path / "train.jsonl").write_text(rows(TRAIN_PROBLEMS))
    (tmp_path / "eval.jsonl").write_text(rows(EVAL_PROBLEMS))
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "numreward.py").write_text(SHAPED)
    home = tmp_path / "home"
    monkeypatch.setenv("POSTTRAIN_HOME", str(home))
    overrides = {"data": {"task": "", "files": [str(tmp_path / "train.jsonl")], "schema": "prompt_answer",
                          "eval_files": [str(tmp_path / "eval.jsonl")], "eval_size": 0},
                 "model": {"base_path": str(smollm2_dir)},
                 "sft": {"enabled": False},
                 "eval": {"k": 0, "max_new_tokens": 16, "num_problems": 4},
                 "rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 16,
                        "checkpoint_every": 0},
                 "reward": {"fn": "numreward:number_then_brevity", "python_path": [str(tmp_path / "rewards")]}}
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
