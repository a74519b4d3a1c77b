"""Held-out evaluation: greedy accuracy always; sampled accuracy (mean over k samples) and pass@k only when
`eval.k > 0`. The prompt is rendered with the model's own chat template; generation stops at every EOS id of the
model folder; sampling uses eval.temperature, eval.top_p and eval.top_k.

Every completion is scored by `posttrain.rewards.RewardScorer` - the task's verifier, or the user's
`reward.fn` in the same sandboxed child process, with the same call convention and `reward.timeout_s`, as
RL's reward workers - and counts as correct when its score is >= 1.0. Failed reward calls (raised, timed
out, returned a non-number) count as incorrect and are reported (`reward_failures`, a few reasons); a
function that needs an argument no eval row supplies is refused before anything is generated.

Which rows are scored: with the built-in verifier, those with a reference answer; with a user function, all
of them (it may not need an answer). Leaves out: stopping on a failure rate (RL does that; eval reports).

Engine (`eval.backend`): posttrain.models.generate on the transformers model, or the vLLM rollout engine
(posttrain.rl.roles.rollout_vllm; same stop ids, sampling and seeds contract).

In an environment (eval.environment / eval.tools; posttrain.eval.episodes): each problem is a multi-turn
episode (on either engine), its last sampled turn is what is scored, response tokens count the model's own
only, the report's `episodes` says what happened and every problem keeps its greedy episode turn by turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.config import ConfigError, EvalConfig, RewardConfig, RolloutBackend
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages, read_examples
from posttrain.eval.episodes import episode_summary, run_eval_episodes
from posttrain.eval.report import EvalReport
from posttrain.models.generate import generate
from posttrain.models.io import eos_token_ids, load_model, load_tokenizer
from posttrain.rewards import RewardSample, RewardScorer
from posttrain.tracking.progress import Progress

FAILURE_EXAMPLES = 5
"""Distinct failure reasons kept in the report."""


def evaluate(model_dir: str | Path, dataset_dir: str | Path, cfg: EvalConfig, reward: RewardConfig | None = None, *,
             device: str = "cpu") -> EvalReport:
    reward = reward or RewardConfig()
    rows = read_examples(dataset_dir, "eval")
    problems = rows if reward.fn else [ex for ex in rows if ex.get("answer") is not None]
    if cfg.num_problems:
        problems = problems[: cfg.num_problems]
    if not problems:
        raise ConfigError(f"{dataset_dir}: the eval split has no problems with a reference answer to score "
                         "(set reward.fn to score rows without one)")
    with RewardScorer(reward) as scorer:
        scorer.check_arguments({k for ex in problems for k in (ex.get("columns") or {})})  # before generating
        torch.set_num_threads(max(1, torch.get_num_threads()))
        tok = load_tokenizer(model_dir)
        if cfg.environment or cfg.tools:
            greedy_eps, sampled_eps, seconds, tool_names = run_eval_episodes(model_dir, tok, cfg, problems, device)
            greedy_texts, sampled_texts = [e.final_text for e in greedy_eps], [e.final_text for e in sampled_eps]
            n_tokens = sum(sum(e.sampled) for e in greedy_eps + sampled_eps)  # the model's own tokens only
            episodes = episode_summary(greedy_eps + sampled_eps, cfg.environment, tool_names)
            transcripts = [[list(t) for t in e.transcript] for e in greedy_eps]
        else:
            gen = generator(model_dir, tok, cfg, device)
            prompts = [encode_prompt(tok, prompt_messages(ex)) for ex in problems]
            t0 = time.perf_counter()  # generation only: not the model's loading or the engine's start
            greedy = gen(prompts, temperature=0.0, n=1, on_batch=_progress("greedy"))
            sampled = gen(prompts, temperature=cfg.temperature, n=cfg.k, on_batch=_progress(f"sampled (k={cfg.k})")) \
                if cfg.k > 0 else []
            seconds = time.perf_counter() - t0
            greedy_texts, sampled_texts = ([tok.decode(g.response_ids, skip_special_tokens=True) for g in gs]
                                           for gs in (greedy, sampled))
            n_tokens = sum(len(g.response_ids) for g in greedy + sampled)
            episodes, transcripts = None, None

        g_res = scorer.score([RewardSample.from_example(ex, t) for t, ex in zip(greedy_texts, problems)])
        s_res = scorer.score([RewardSample.from_example(problems[i // cfg.k], t) for i, t in enumerate(sampled_texts)])
        scorer_name = scorer.name if reward.fn else f"verifier:{problems[0].get('task')}"
    g_ok = [r.failure is None and r.score >= 1.0 for r in g_res]
    s_ok = [[r.failure is None and r.score >= 1.0 for r in s_res[i * cfg.k:(i + 1) * cfg.k]]
            for i in range(len(problems))] if cfg.k > 0 else []
    failures = [r.failure for r in g_res + s_res if r.failure is not None]
    n_completions = len(greedy_texts) + len(sampled_texts)
    every = [{"prompt": prompt_messages(ex)[-1]["content"], "greedy": t, "answer": ex.get("answer"),
              "score": r.score, "correct": ok, "failure": r.failure,
              "sampled_correct": sum(s_ok[i]) if cfg.k > 0 else None,
              **({"episode": transcripts[i]} if transcripts is not None else {})}
             for i, (ex, t, r, ok) in enumerate(zip(problems, greedy_texts, g_res, g_ok))]
    samples = [{k: v for k, v in p.items() if k != "sampled_correct"} for p in every[:10]]
    return EvalReport(
        greedy_accuracy=sum(g_ok) / len(problems),
        sampled_accuracy=sum(sum(r) for r in s_ok) / (len(problems) * cfg.k) if cfg.k > 0 else None,
        pass_at_k=sum(any(r) for r in s_ok) / len(problems) if cfg.k > 0 else None,
        num_problems=len(problems), k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, scorer=scorer_name,
        reward_failures=len(failures), reward_calls=len(g_res) + len(s_res),
        reward_failure_examples=_distinct(failures, FAILURE_EXAMPLES),
        mean_response_tokens=n_tokens / n_completions, seconds=seconds,
        generated_tokens_per_s=n_tokens / max(seconds, 1e-9), samples=samples, problems=every, episodes=episodes)


def _progress(what: str) -> Callable[[int, int], None]:
    """Prints `eval greedy: 256/500 (51%), 40.1 sample/s, ETA 6s` at the pace of posttrain.tracking.progress (the
    default PROGRESS_EVERY_S: eval has no tracking config)."""
    state: dict = {}

    def on_batch(done: int, total: int) -> None:
        p = state.setdefault("p", Progress(total, unit="sample"))
        if p.due(done):
            print(f"eval {what}: {p.stats(done)}", flush=True)
    return on_batch


def generator(model_dir, tok, cfg: EvalConfig, device: str = "cpu"):
    """gen(prompts, temperature=, n=, on_batch=) -> list[Generation] on the engine `eval.backend` names (vLLM
    generates all at once: no progress lines)."""
    kw = {"max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "top_p": cfg.top_p, "top_k": cfg.top_k}
    if cfg.backend == RolloutBackend.VLLM:
        from posttrain.rl.roles.rollout_vllm import VLLMEngine

        engine = VLLMEngine(str(model_dir))
        return lambda prompts, *, temperature, n, on_batch: engine.generate(prompts, temperature=temperature, n=n,
                                                                            **kw)
    model = load_model(model_dir, device=device)
    stop = {"eos_id": eos_token_ids(model_dir, tok), "pad_id": tok.pad_token_id, "batch_size": cfg.batch_size}
    return lambda prompts, *, temperature, n, on_batch: generate(model, prompts, temperature=temperature, n=n,
                                                                 on_batch=on_batch, **kw, **stop)


def _distinct(reasons: list[str], n: int) -> list[str]:
    out: list[str] = []
    for r in reasons:
        if r not in out:
            out.append(r)
        if len(out) == n:
            break
    return out
