"""OpenEnv environments, run unchanged: `rl.environment` may name a subclass of `openenv-core`'s
`openenv.core.env_server.Environment` (the optional extra `posttrain[openenv]`). It runs in-process in the
episodes' tool process, like every environment, through an adapter to our convention (`posttrain.envs.host`):

- an `MCPEnvironment` (OpenEnv's tool-calling environments): its MCP tools are the episode's tools, listed
  with their own JSON schemas; a call is a `CallToolAction`, its result the text of the MCP result, and an
  MCP error (a tool that raised, an unknown tool, invalid arguments) the failure the model reads;
- any other `Environment[Action, Observation, State]`: the episode's turns are its actions. An Action with one
  string field (a message, a command, a move in a text game) gets the turn's text; any other Action is shown
  to the model as one tool whose arguments are the Action's fields (its pydantic JSON schema), and the turn
  must call it in the documented format (`posttrain.envs.calls`); a turn that does not, or whose arguments do
  not validate, is answered with the error and the episode goes on.

`reset(**row)` gets the row's fields (OpenEnv's reset takes **kwargs) and its observation is the episode's
first; an observation becomes text as its one string field, or as JSON of its fields (without `done`,
`reward` and `metadata`). Each step's `reward` is a per-turn reward and `done` ends the episode; the rewards
that tool calls' observations carry are the episode's reward (`get_reward`). The episode's instance is
closed with `close()` when it ends.

Not covered: OpenEnv's HTTP / WebSocket clients and Docker-hosted environments (the tool process runs the
environment class itself), and an MCP environment's own non-MCP actions (`_step_impl`).
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from posttrain.envs.calls import CallError, parse_call
from posttrain.envs.host import ToolFailure, named_fields
from posttrain.envs.tools import RESERVED, ToolError, ToolSpec

_BASE_FIELDS = {"done", "reward", "metadata"}
"""An Observation's fields every OpenEnv observation has: the episode's, not the model's text."""


def _named_base(cls: type, name: str) -> bool:
    return any(c.__name__ == name and c.__module__.startswith("openenv.") for c in cls.__mro__)


def is_openenv(cls: type) -> bool:
    """Whether `cls` is an OpenEnv Environment (read from its bases: openenv is imported only for those)."""
    return isinstance(cls, type) and _named_base(cls, "Environment")


def as_environment(cls: type, where: str = "rl.environment") -> type:
    """`cls` itself, or the adapter of an OpenEnv environment."""
    return adapt(cls, where) if is_openenv(cls) else cls


def adapt(cls: type, where: str = "rl.environment") -> type:
    """A class in our environment convention that runs the OpenEnv environment `cls` (ToolError: it cannot)."""
    if _named_base(cls, "MCPEnvironment"):
        return _mcp_adapter(cls, where)
    action = _action_type(cls, where)
    text_field = _text_field(action)
    spec = None if text_field else _action_spec(action)
    return _step_adapter(cls, action, text_field, spec)


# --------------------------------------------------------------------------------------------- text

def observation_text(obs: Any) -> str:
    """What the model reads of an observation: its one string field, else JSON of its own fields."""
    fields = obs.model_dump(mode="json", exclude=_BASE_FIELDS)
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    return json.dumps(fields, ensure_ascii=False) if fields else ""


def _reward(obs: Any) -> float | None:
    return None if obs.reward is None else float(obs.reward)


# --------------------------------------------------------------------------------------------- Action / step

def _action_type(cls: type, where: str) -> type:
    """The environment's Action class: `step`'s annotation, else Environment[Action, ...]'s first argument."""
    from openenv.core.env_server.types import Action

    try:
        candidates = [typing.get_type_hints(cls.step).get("action")]
    except (NameError, TypeError):  # unresolvable annotations: the generic arguments may still say
        candidates = []
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and _named_base(typing.get_origin(base) or object, "Environment"):
                candidates.append(args[0])
    for c in candidates:
        if isinstance(c, type) and issubclass(c, Action) and c is not Action:
            return c
    raise ToolError(f"{where}: {cls.__module__}.{cls.__qualname__} is an OpenEnv environment whose Action class "
                    "cannot be read: annotate step(self, action: MyAction) or subclass Environment[MyAction, ...]")


def _text_field(action: type) -> str | None:
    """The Action's field a turn's text fills: its only field besides metadata, when that is a string."""
    fields = {n: f for n, f in action.model_fields.items() if n != "metadata"}
    if len(fields) == 1:
        name, f = next(iter(fields.items()))
        if f.annotation is str:
            return name
    return None


def _tool_name(action: type) -> str:
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", action.__name__.removesuffix("Action")).lower() or "act"
    return "act" if name in RESERVED else name


def _action_spec(action: type) -> ToolSpec:
    schema = action.model_json_schema()
    schema.pop("title", None)
    props = {n: p for n, p in schema.get("properties", {}).items() if n != "metadata"}
    for p in props.values():
        p.pop("title", None)
    params = {**schema, "type": "object", "properties": props,
              "required": [n for n in schema.get("required", []) if n in props]}
    doc = (action.__doc__ or "").strip() or f"Act in the environment ({action.__name__})."
    name = _tool_name(action)
    return ToolSpec(name=name, schema={"type": "function", "function": {
        "name": name, "description": doc, "parameters": params}})


def _step_adapter(cls: type, action: type, text_field: str | None, spec: ToolSpec | None) -> type:
    class Adapter:
        _posttrain_specs = [spec] if spec else []

        def reset(self, **row) -> str | None:
            self.env = cls()
            return observation_text(self.env.reset(**named_fields(self.env.reset, row))) or None

        def step(self, text: str) -> dict:
            from pydantic import ValidationError

            if text_field:
                fields = {text_field: text}
            else:
                call = parse_call(text, [spec])
                if call is None or isinstance(call, CallError):
                    why = call.message if call is not None else "the turn made no call"
                    return {"observation": f"error: {why}; act by calling {spec.name}"}
                fields = call.arguments
            try:
                act = action(**fields)
            except ValidationError as e:  # the model's action does not fit the Action: it is told why
                return {"observation": f"error: {spec.name if spec else action.__name__}: "
                                       f"{e.errors(include_url=False, include_context=False)}"}
            obs = self.env.step(act)
            return {"observation": observation_text(obs), "reward": _reward(obs), "done": bool(obs.done)}

        def close(self) -> None:
            self.env.close()

    Adapter.__qualname__ = Adapter.__name__ = f"{cls.__qualname__} (OpenEnv)"
    return Adapter


# --------------------------------------------------------------------------------------------- MCP tools

def _mcp_tools(cls: type, where: str) -> list[ToolSpec]:
    """The MCP tools of one instance of `cls`, as the model is told about them."""
    from openenv.core.env_server.mcp_types import ListToolsAction

    probe = cls()
    try:
        tools = probe.step(ListToolsAction()).tools
    finally:
        probe.close()
    specs = []
    for t in tools:
        if t.name in RESERVED or t.name.startswith("_"):
            raise ToolError(f"{where}: {cls.__qualname__}'s MCP tool {t.name!r} has a name an episode reserves "
                            f"({', '.join(RESERVED)}, or a leading _)")
        specs.append(ToolSpec(name=t.name, schema={"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema}}))
    return specs


_MCP_ERRORS = {"tool_not_found": "unknown_tool", "invalid_args": "bad_call", "timeout": "timeout"}
"""An MCP error's kind as the episode counts it (execution and transport errors: raised)."""


def result_text(result: Any) -> str:
    """An MCP tool result's text (its text contents joined); a result with other content is refused."""
    content = getattr(result, "content", None)
    if content is None:
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    texts = [c.text for c in content if getattr(c, "type", None) == "text"]
    if len(texts) != len(content):
        kinds = sorted({getattr(c, "type", type(c).__name__) for c in content} - {"text"})
        raise ValueError(f"the tool returned {', '.join(kinds)} content, not text")
    return "\n".join(texts)


def _mcp_adapter(cls: type, where: str) -> type:
    specs = _mcp_tools(cls, where)
    names = {s.name for s in specs}

    class Adapter:
        _posttrain_specs = specs

        def reset(self, **row) -> str | None:
            self.env, self.rewards, self.done = cls(), [], False
            return observation_text(self.env.reset(**named_fields(self.env.reset, row))) or None

        def __getattr__(self, name: str):
            if name not in names:
                raise AttributeError(name)
            return lambda **arguments: self._call(name, arguments)

        def _call(self, name: str, arguments: dict) -> str | ToolFailure:
            from openenv.core.env_server.mcp_types import CallToolAction

            if self.done:
                return ToolFailure("raised", "the environment has ended the episode (an earlier call returned done)")
            obs = self.env.step(CallToolAction(tool_name=name, arguments=arguments))
            if obs.reward is not None:
                self.rewards.append(float(obs.reward))
            self.done = bool(obs.done)
            if obs.error is not None:
                kind = _MCP_ERRORS.get(obs.error.error_type.value, "raised")
                return ToolFailure(kind, f"{obs.error.error_type.value}: {obs.error.message}")
            return result_text(obs.result)

        def get_reward(self) -> float:
            """The sum of the rewards the episode's tool calls returned (0 without any)."""
            return sum(self.rewards)

        def close(self) -> None:
            self.env.close()

    Adapter.__qualname__ = Adapter.__name__ = f"{cls.__qualname__} (OpenEnv MCP)"
    return Adapter
