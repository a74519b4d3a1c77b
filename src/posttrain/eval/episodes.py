"""Evaluation in an environment (eval.environment / eval.tools): each held-out problem is a multi-turn episode
run by the same loop as RL's (posttrain.envs.episodes.run_episodes: token-exact, the model's own template),
against the user's environment and tools in their sandboxed tool process (posttrain.envs.process), on the
engine eval.backend names (transformers or vLLM) - greedy (one episode per problem) and, with eval.k > 0, k
sampled ones. What is scored is each episode's last sampled turn (`Episode.final_text`), by the verifier or
reward.fn, exactly as a single completion is.

    greedy, sampled, seconds, tools = run_eval_episodes(model_dir, tok, cfg, problems)
    episode_summary(greedy + sampled) -> {"turns_mean", "tool_calls_mean", "tool_failures", "finished", ...}
"""

from __future__ import annotations

import time
from pathlib import Path

from posttrain.config import EvalConfig, RolloutBackend
from posttrain.data.examples import episode_prompt
from posttrain.envs.episodes import Episode, LocalEnv, run_episodes
from posttrain.envs.plan import checked_layout, episode_limits, episode_process, episode_row
from posttrain.models.generate import Generation, generate
from posttrain.models.io import eos_token_ids, load_model


class _Sampler:
    """The evaluated model as the episodes' Sampler: KV-cache batched decoding at eval.batch_size, stopping at
    every EOS id of the folder."""

    def __init__(self, model_dir: str | Path, tok, batch_size: int, device: str):
        self.model = load_model(model_dir, device=device)
        self.eos, self.pad, self.batch_size = eos_token_ids(model_dir, tok), tok.pad_token_id, batch_size

    def generate(self, prompts, *, n, temperature, max_new_tokens, seed, top_p=1.0, top_k=0) -> list[Generation]:
        return generate(self.model, prompts, max_new_tokens=max_new_tokens, temperature=temperature, n=n,
                        eos_id=self.eos, pad_id=self.pad, seed=seed, batch_size=self.batch_size, top_p=top_p,
                        top_k=top_k)


def _sampler(model_dir: str | Path, tok, cfg: EvalConfig, device: str):
    """The engine `eval.backend` names: the transformers model, or the vLLM rollout engine (the same contract:
    token ids in and out, every EOS id kept as the last token, the sampled distribution's log-probs)."""
    if cfg.backend == RolloutBackend.VLLM:
        from posttrain.rl.roles.rollout_vllm import VLLMEngine

        return VLLMEngine(str(model_dir))
    return _Sampler(model_dir, tok, cfg.batch_size, device)


def run_eval_episodes(model_dir: str | Path, tok, cfg: EvalConfig, problems: list[dict], device: str = "cpu"
                      ) -> tuple[list[Episode], list[Episode], float, list[str]]:
    """(greedy episodes, one per problem; sampled episodes, k per problem in problem order, [] when k == 0;
    seconds the episodes took - not the model's loading or the tool process's start; the names of the tools
    the model was shown - the environment's and eval.tools')."""
    layout = checked_layout(str(model_dir))
    sampler = _sampler(model_dir, tok, cfg, device)
    limits = episode_limits(cfg.episode, cfg.max_new_tokens)
    rows = [episode_row(ex.get("columns"), ex.get("answer")) for ex in problems]
    messages = [episode_prompt(ex) for ex in problems]
    process = episode_process(cfg)  # a bad import path or an undocumented tool fails here, before generating
    try:
        env = LocalEnv(process)
        t0 = time.perf_counter()
        greedy = run_episodes(sampler, layout, env, rows, messages, n=1, limits=limits, temperature=0.0,
                              seed=cfg.seed, key_prefix="greedy")
        print(f"eval greedy episodes: {len(greedy)} done, {_mean(e.turns for e in greedy):.2f} turns each", flush=True)
        sampled = run_episodes(sampler, layout, env, rows, messages, n=cfg.k, limits=limits,
                               temperature=cfg.temperature, seed=cfg.seed, top_p=cfg.top_p, top_k=cfg.top_k,
                               key_prefix="sampled") if cfg.k > 0 else []
        seconds = time.perf_counter() - t0
    finally:
        process.shutdown()
    return greedy, sampled, seconds, [s.name for s in process.specs]


def episode_summary(episodes: list[Episode], environment: str, tools: list[str]) -> dict:
    """What happened in the episodes (`tools`: the names of those the model was shown): turns and tool calls per
    episode, failed calls by kind, the share that finished (the environment ended them or the model answered,
    not cut by a limit), and the environment's own reward per episode (per-turn rewards and get_reward; None
    when it gives none)."""
    failures: dict[str, int] = {}
    for e in episodes:
        for kind, n in e.tool_failures.items():
            failures[kind] = failures.get(kind, 0) + n
    rewarded = [e for e in episodes if e.step_rewards or e.env_reward is not None]
    return {"environment": environment, "tools": list(tools), "episodes": len(episodes),
            "turns_mean": _mean(e.turns for e in episodes), "tool_calls_mean": _mean(e.tool_calls for e in episodes),
            "tool_failures": failures, "finished": _mean(e.finished for e in episodes),
            "env_reward_mean": _mean(sum(e.step_rewards) + (e.env_reward or 0.0) for e in episodes)
            if rewarded else None}


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
