"""The tool-call format: how tools are shown to the model, how a call is read from its text, how a result is
given back - one documented format rendered through the model's OWN chat template as ordinary turns, so it
works for templates that render tools natively and for those that silently drop `tools` / `tool_calls` /
`tool` turns (SmolLM2-135M-Instruct's, FACTS) alike:

- the tools: a system turn (or the start of the first user turn for templates without a system role) holding
  `TOOLS_HEADER` and one JSON schema per line between `<tools>` and `</tools>` (the ChatML / Qwen convention
  TRL's qwen2_5 template uses);
- a call: the assistant writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` - one call per turn;
  text before it is allowed (reasoning), text after it is ignored by the parser but stays in the sampled
  tokens (it was sampled);
- a result: a user turn `<tool_response>\n...\n</tool_response>`.

`parse_call` never raises on any text: a turn without `<tool_call>` is a final answer (None); a malformed call
is a `CallError` whose message is given back to the model as the tool result, and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from posttrain.envs.tools import ToolSpec

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOLS_HEADER = ("You may call one of these tools per turn. To call one, write "
                f'{CALL_OPEN}{{"name": <tool name>, "arguments": {{<arguments>}}}}{CALL_CLOSE}; its result '
                f"comes back between {RESPONSE_OPEN} and {RESPONSE_CLOSE}.")


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool the episode has, with a JSON object of arguments."""
    name: str
    arguments: dict


@dataclass(frozen=True)
class CallError:
    """A call the model tried to make and got wrong: what it is told, as the tool's result."""
    message: str


def tools_block(specs: list[ToolSpec]) -> str:
    """The text that tells the model its tools (one schema per line, keys sorted: the same tools always render
    to the same tokens)."""
    lines = [json.dumps(s.schema, sort_keys=True, ensure_ascii=False) for s in specs]
    return "\n".join([TOOLS_HEADER, "<tools>", *lines, "</tools>"])


def render_call(name: str, arguments: dict) -> str:
    """A call as the model should write it (for demonstrations)."""
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CALL_CLOSE}"


def response_turn(text: str) -> dict:
    """The turn that gives a tool's result (or an error) back to the model."""
    return {"role": "user", "content": f"{RESPONSE_OPEN}\n{text}\n{RESPONSE_CLOSE}"}


def parse_call(text: str, specs: list[ToolSpec]) -> ToolCall | CallError | None:
    """The call in one assistant turn's text: None when it makes none (a final answer), else the first
    `<tool_call>...</tool_call>`, checked against the tools' names and required arguments."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return None
    end = text.find(CALL_CLOSE, start)
    if end < 0:
        return CallError(f"the call is not closed with {CALL_CLOSE}")
    try:
        call = json.loads(text[start + len(CALL_OPEN):end])
    except ValueError as e:
        return CallError(f"the call is not valid JSON: {e}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return CallError('a call is a JSON object {"name": <tool name>, "arguments": {...}}')
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        return CallError(f"the arguments of {call['name']!r} must be a JSON object")
    spec = next((s for s in specs if s.name == call["name"]), None)
    if spec is None:
        return CallError(f"no tool named {call['name']!r}; the tools are {[s.name for s in specs]}")
    params = spec.parameters
    missing = [p for p in params.get("required", []) if p not in args]
    unknown = [a for a in args if a not in params.get("properties", {})]
    problems = ([f"missing argument(s) {missing}"] if missing else []) + ([f"unknown argument(s) {unknown}"]
                                                                        if unknown else [])
    if problems:
        return CallError(f"{spec.name}: " + "; ".join(problems))
    return ToolCall(name=spec.name, arguments=args)
