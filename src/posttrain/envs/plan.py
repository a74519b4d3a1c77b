"""What the RL stage checks about its episodes before any actor starts (rl.environment / rl.tools), and what
it keys its cache on:

    identity = check_episodes(rl_cfg, model_dir)   # {import path: source sha256}; raises naming what is wrong

- the environment and tools import in a short-lived tool process (never in this one) and every tool has types
  and documentation (a ToolError names the class, method or argument);
- the start model's chat template can keep an episode's tokens as sampled (EpisodeLayout.check: it renders
  earlier turns as a prefix of later ones and ends an assistant turn with one of the model's stop tokens).

The identity - the source sha256 of the environment's module and each tool's - goes into the RL stage's cache
key: a changed environment trains a new model instead of returning the cached one.
"""

from __future__ import annotations

from posttrain.config import RLConfig
from posttrain.envs.episodes import EpisodeLayout
from posttrain.envs.process import ToolLimits, ToolProcess


def check_episodes(rl: RLConfig, model_dir: str) -> dict[str, str]:
    """{} without rl.environment / rl.tools."""
    if not (rl.environment or rl.tools):
        return {}
    from posttrain.models.io import eos_token_ids, load_tokenizer

    e = rl.episode
    process = ToolProcess(rl.environment, rl.tools, e.python_path,
                          ToolLimits(timeout_s=e.tool_timeout_s, cpu_s=e.tool_cpu_s, memory_mb=e.tool_memory_mb,
                                     max_result_chars=e.max_result_chars))
    try:
        identity = dict(process.identity)
    finally:
        process.shutdown()
    tok = load_tokenizer(model_dir)
    EpisodeLayout.check(tok, eos_token_ids(model_dir, tok), name=f"the chat template of {model_dir}")
    return identity
