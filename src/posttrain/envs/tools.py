"""Tools as the ecosystem writes them: typed Python callables with Google-style docstrings, described to the
model by the OpenAI-style JSON schema `transformers.utils.get_json_schema` reads from the signature (as TRL's
`tools=` and `environment_factory=` do).

    specs = tool_specs([calculate])                 # plain functions (rl.tools)
    specs = environment_tools(CalculatorEnv)        # an environment class: its public methods are its tools

An environment's public methods are its tools except the episode protocol's own (`RESERVED`: reset, step,
get_reward, close, state) and names starting with `_`. Every tool needs a type hint on each argument and a
docstring describing it: a tool the model cannot be told about is refused here, naming the class, the method
and what is missing, before any work.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from posttrain.config.errors import ConfigError

RESERVED = ("reset", "step", "get_reward", "close", "state")
"""An environment's episode protocol: never exposed as tools."""


class ToolError(ConfigError):
    """A tool or environment that cannot be described to the model; the message names it and the fix."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model is told about it: its name and its function schema
    ({"type": "function", "function": {"name", "description", "parameters"}})."""
    name: str
    schema: dict

    @property
    def parameters(self) -> dict:
        return self.schema["function"]["parameters"]


def tool_spec(fn: Callable, where: str) -> ToolSpec:
    """The schema of one callable; `where` names it in errors (e.g. "rl.tools: pkg.mod:calculate")."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    if not inspect.getdoc(fn):
        raise ToolError(f"{where}: has no docstring; the model is told what a tool does from it "
                        "(a Google-style docstring with an Args: section)")
    try:
        schema = get_json_schema(fn)
    except (TypeHintParsingException, DocstringParsingException) as e:
        raise ToolError(f"{where}: {e}") from None
    params = schema["function"]["parameters"].get("properties", {})
    undocumented = [name for name, p in params.items() if not p.get("description")]
    if undocumented:
        raise ToolError(f"{where}: argument(s) {undocumented} have no description in the docstring's Args: section")
    return ToolSpec(name=schema["function"]["name"], schema=schema)


def tool_specs(fns: list[Callable], where: str = "rl.tools") -> list[ToolSpec]:
    """Schemas of plain tool functions; two tools of one name are refused."""
    specs = [tool_spec(fn, f"{where}: {getattr(fn, '__qualname__', fn)!s}") for fn in fns]
    return _unique(specs, where)


def environment_tools(cls: type, where: str = "rl.environment") -> list[ToolSpec]:
    """The tools of an environment class: its public methods other than the episode protocol's."""
    if not isinstance(cls, type):
        raise ToolError(f"{where}: {cls!r} is not a class")
    specs = []
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") or name in RESERVED:
            continue
        specs.append(tool_spec(member, f"{where}: {cls.__module__}.{cls.__qualname__}.{name}"))
    return _unique(specs, where)


def _unique(specs: list[ToolSpec], where: str) -> list[ToolSpec]:
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise ToolError(f"{where}: two tools are named {s.name!r}")
        seen.add(s.name)
    return specs
