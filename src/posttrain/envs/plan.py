"""What the RL and eval stages check about their episodes before any actor starts or anything is generated
(rl.environment / rl.tools, eval.environment / eval.tools), and what they key their caches on:

    identity = check_episodes(cfg.rl, model_dir)   # {import path: source sha256}; raises naming what is wrong

- the environment and tools import in a short-lived tool process (never in this one) and every tool has types
  and documentation (a ToolError names the class, method or argument);
- the start model's chat template can keep an episode's tokens as sampled (EpisodeLayout.check: it renders
  earlier turns as a prefix of later ones and ends an assistant turn with one of the model's stop tokens).

The identity - the source sha256 of the environment's module and each tool's - goes into the stage's cache
key: a changed environment trains a new model (or evaluates again) instead of returning the cached one.
"""

from __future__ import annotations

from posttrain.config import EpisodeConfig, EvalConfig, RLConfig
from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits
from posttrain.envs.process import ToolLimits, ToolProcess


def episode_limits(e: EpisodeConfig, max_new_tokens: int) -> EpisodeLimits:
    """An episode's limits: `e`'s, with `max_new_tokens` per sampled turn (rl's or eval's)."""
    return EpisodeLimits(max_turns=e.max_turns, max_new_tokens=max_new_tokens, max_env_tokens=e.max_env_tokens,
                         max_total_tokens=e.max_total_tokens)


def episode_row(columns: dict, answer: str | None) -> dict:
    """What an episode's `reset(**row)` may name: the dataset row's columns and its answer."""
    return {**(columns or {}), **({"answer": answer} if answer is not None else {})}


def checked_layout(model_dir: str) -> EpisodeLayout:
    """The model folder's episode layout, or a ToolError naming what its chat template does that episodes
    cannot use."""
    from posttrain.models.io import eos_token_ids, load_tokenizer

    tok = load_tokenizer(model_dir)
    return EpisodeLayout.check(tok, eos_token_ids(model_dir, tok), name=f"the chat template of {model_dir}")


def tool_limits(e: EpisodeConfig) -> ToolLimits:
    return ToolLimits(timeout_s=e.tool_timeout_s, cpu_s=e.tool_cpu_s, memory_mb=e.tool_memory_mb,
                      max_result_chars=e.max_result_chars)


def episode_process(section: RLConfig | EvalConfig) -> ToolProcess:
    """The sandboxed tool process of `section`.environment / .tools, with `section`.episode's limits; a bad
    import path or a tool without types or docs fails here, naming it."""
    return ToolProcess(section.environment, section.tools, section.episode.python_path, tool_limits(section.episode))


def check_episodes(section: RLConfig | EvalConfig, model_dir: str) -> dict[str, str]:
    """{} without `section`.environment / .tools (section: the RL or the eval config)."""
    if not (section.environment or section.tools):
        return {}
    process = episode_process(section)
    try:
        identity = dict(process.identity)
    finally:
        process.shutdown()
    checked_layout(model_dir)
    return identity
