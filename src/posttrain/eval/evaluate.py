"""Held-out evaluation: greedy accuracy, sampled accuracy (mean over k samples at a temperature) and
pass@k, reported separately and scored by the task's verifier or a user function `module:function`
(signature `fn(completion: str, answer: str | None, task: str | None) -> float`; >= 1.0 counts as correct).
The prompt is rendered with the model's own chat template.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from posttrain.config import EvalConfig, RewardConfig
from posttrain.data import verifiers
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages, read_examples
from posttrain.eval.report import EvalReport
from posttrain.models.generate import generate
from posttrain.models.io import load_model, load_tokenizer
from posttrain.rewards import load_reward_fn


def evaluate(model_dir: str | Path, dataset_dir: str | Path, cfg: EvalConfig, reward: RewardConfig | None = None, *,
             device: str = "cpu") -> EvalReport:
    reward = reward or RewardConfig()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tok = load_model(model_dir, device=device), load_tokenizer(model_dir)
    problems = [ex for ex in read_examples(dataset_dir, "eval") if ex.get("answer") is not None]
    if cfg.num_problems:
        problems = problems[: cfg.num_problems]
    if not problems:
        raise ValueError(f"{dataset_dir}: the eval split has no problems with a reference answer to score")
    user_fn = load_reward_fn(reward.fn) if reward.fn else None

    def correct(text: str, ex: dict) -> bool:
        if user_fn is not None:
            return float(user_fn(text, ex["answer"], ex.get("task"))) >= 1.0
        return verifiers.score(ex.get("task"), text, ex["answer"]) >= 1.0

    prompts = [encode_prompt(tok, prompt_messages(ex)) for ex in problems]
    kw = dict(max_new_tokens=cfg.max_new_tokens, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
              batch_size=cfg.batch_size)
    t0 = time.perf_counter()
    greedy = generate(model, prompts, temperature=0.0, n=1, seed=cfg.seed, **kw)
    sampled = generate(model, prompts, temperature=cfg.temperature, n=cfg.k, seed=cfg.seed, **kw)
    seconds = time.perf_counter() - t0
    decode = lambda g: tok.decode(g.response_ids, skip_special_tokens=True)  # noqa: E731
    g_ok = [correct(decode(g), ex) for g, ex in zip(greedy, problems)]
    s_ok = [[correct(decode(sampled[i * cfg.k + j]), ex) for j in range(cfg.k)] for i, ex in enumerate(problems)]
    n_tokens = sum(len(g.response_ids) for g in greedy + sampled)
    samples = [{"prompt": prompt_messages(ex)[-1]["content"], "greedy": decode(g), "answer": ex["answer"],
                "correct": ok} for ex, g, ok in list(zip(problems, greedy, g_ok))[:10]]
    return EvalReport(
        greedy_accuracy=sum(g_ok) / len(problems),
        sampled_accuracy=sum(sum(r) for r in s_ok) / (len(problems) * cfg.k),
        pass_at_k=sum(any(r) for r in s_ok) / len(problems),
        num_problems=len(problems), k=cfg.k, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed, scorer=reward.fn or f"verifier:{problems[0].get('task')}",
        mean_response_tokens=n_tokens / len(greedy + sampled), seconds=seconds,
        generated_tokens_per_s=n_tokens / seconds, samples=samples)
