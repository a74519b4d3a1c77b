"""Where an episode's environment lives: one instance per episode, built from the dataset row, whose tools
and `step` are called by name. It runs inside the tool process (`posttrain.envs.process`), never in the
trainer's: user code is imported there only.

The environment convention (TRL's `environment_factory`, OpenEnv's reset/step):

    class Calculator:                       # rl.environment = "my_pkg.envs:Calculator"
        def reset(self, **row) -> str | None:      # optional: the row's fields it names; may return a first observation
        def calculate(self, expression: str) -> str:  # every other public method is a tool (typed, documented)
        def step(self, text: str) -> str | dict:   # optional: text-in / text-out (games, simulated users)
        def get_reward(self) -> float:             # optional: the episode's own reward, read at its end

`step` returns the observation, or {"observation": str, "reward": float, "done": bool} to give a per-turn
reward or end the episode. Plain tool functions (`rl.tools`) are the simple case: a host without a class.
An OpenEnv environment (a subclass of openenv-core's `Environment`) runs unchanged through its adapter
(`posttrain.envs.openenv.as_environment`, applied where the class is imported), which gives the host its tools'
schemas as `_posttrain_specs`.

A tool's result is text for the model: a str as is; a number, bool, None, list or dict as JSON; bytes only if
they are UTF-8. Anything else, and every exception a tool raises, is a `ToolFailure` whose message the model
reads instead (and which is counted); the host never raises from a tool call.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.envs.tools import RESERVED, ToolError, ToolSpec, environment_tools, tool_specs


@dataclass(frozen=True)
class ToolFailure:
    """A call that produced no usable text: `kind` is what is counted (raised, not_text, ...), `message` what
    the model reads."""
    kind: str
    message: str


@dataclass(frozen=True)
class StepResult:
    """What a text-in / text-out `step` gave back."""
    observation: str
    reward: float | None = None
    done: bool = False


def as_text(value: Any) -> str | ToolFailure:
    """A tool's return value as the text the model reads (a ToolFailure an adapter returned stays one)."""
    if isinstance(value, (str, ToolFailure)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            return ToolFailure("not_text", f"the tool returned bytes that are not UTF-8 text ({e.reason} at {e.start})")
    if value is None or isinstance(value, (bool, int, float, list, dict)):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            return ToolFailure("not_text", f"the tool returned a {type(value).__name__} that is not JSON: {e}")
    return ToolFailure("not_text", f"the tool returned a {type(value).__name__}, not text")


def _reward(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} returned {value!r}, not a finite number")
    return float(value)


def named_fields(fn: Callable, row: dict) -> dict:
    """The row's fields `fn` names (all of them when it takes **kwargs), as reward functions get theirs."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return dict(row)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in row.items() if k in names}


class EnvironmentHost:
    """The episodes' environment instances in this process, by episode key."""

    def __init__(self, env_cls: type | None = None, tools: list[Callable] = ()):
        if env_cls is None and not tools:
            raise ToolError("an episode needs an environment class (rl.environment) or tools (rl.tools)")
        self.env_cls, self.tools = env_cls, {getattr(t, "__name__", str(t)): t for t in tools}
        env_specs = getattr(env_cls, "_posttrain_specs", None)  # an adapter's tools (OpenEnv's MCP tools, its Action)
        if env_specs is None:
            env_specs = environment_tools(env_cls) if env_cls is not None else []
        self.specs: list[ToolSpec] = env_specs + tool_specs(list(tools))
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ToolError(f"rl.environment and rl.tools both define a tool named "
                            f"{sorted({n for n in names if names.count(n) > 1})}")
        self.has_step = env_cls is not None and callable(getattr(env_cls, "step", None))
        self.has_reward = env_cls is not None and callable(getattr(env_cls, "get_reward", None))
        self._episodes: dict[str, Any] = {}

    def open(self, key: str, row: dict) -> str | None:
        """Start an episode: a fresh instance, `reset(**row)` when it has one; its first observation or None.
        Errors here are the environment's own (a bad row): they propagate, naming the episode."""
        if self.env_cls is None:
            self._episodes[key] = None
            return None
        env = self.env_cls()
        obs = env.reset(**named_fields(env.reset, row)) if callable(getattr(env, "reset", None)) else None
        self._episodes[key] = env
        if obs is not None and not isinstance(obs, str):
            raise ValueError(f"{self.env_cls.__qualname__}.reset returned a {type(obs).__name__}, not a str or None")
        return obs

    def call(self, key: str, name: str, arguments: dict) -> str | ToolFailure:
        """One tool call of episode `key`; never raises."""
        env = self._episodes[key]
        fn = self.tools.get(name)
        if fn is None:
            if env is None or name.startswith("_") or name in RESERVED or not hasattr(env, name):
                return ToolFailure("unknown_tool", f"no tool named {name!r}")
            fn = getattr(env, name)
        try:
            value = fn(**arguments)
        except BaseException as e:
            if isinstance(e, MemoryError):
                raise  # the process's memory limit: the parent replaces the process
            from posttrain.rewards.sandbox import describe

            return ToolFailure("raised", f"the tool raised {describe(e)}")
        return as_text(value)

    def step(self, key: str, text: str) -> StepResult:
        """The environment's text-in / text-out step."""
        env = self._episodes[key]
        if not self.has_step:
            raise ToolError(f"rl.environment: {self.env_cls!r} has no step(text)")
        out = env.step(text)
        where = f"{self.env_cls.__qualname__}.step"
        if isinstance(out, str):
            return StepResult(observation=out)
        if (isinstance(out, dict) and isinstance(out.get("observation", ""), str)
                and set(out) <= {"observation", "reward", "done"}):
            reward = out.get("reward")
            return StepResult(observation=out.get("observation", ""), done=bool(out.get("done", False)),
                              reward=None if reward is None else _reward(reward, where))
        raise ValueError(f"{where} returned {type(out).__name__}: give a str or "
                         "{'observation': str, 'reward': float, 'done': bool}")

    def reward(self, key: str) -> float | None:
        """The episode's own reward (`get_reward()`), or None without one."""
        env = self._episodes.get(key)
        if env is None or not self.has_reward:
            return None
        return _reward(env.get_reward(), f"{self.env_cls.__qualname__}.get_reward")

    def close(self, key: str) -> None:
        env = self._episodes.pop(key, None)
        if env is not None and callable(getattr(env, "close", None)):
            env.close()

