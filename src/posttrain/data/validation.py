"""Row validation: every problem names the file, the row (or line) and the field; all problems are
collected (up to a cap) and raised together, before anything is written.

A row becomes {"messages", "answer", "task", "columns"}: the schema's fields make the chat turns and the
reference answer; every other column is kept under "columns" as JSON (NaN -> null, bytes -> {"base64": ...},
dates and times -> ISO 8601 text, decimals -> text); values of any other type, infinities and non-text
object keys are refused, naming the column. Chat turns are only system/user/assistant; tool calls and
multimodal content are not supported.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
from typing import Any

from posttrain.config import DataConfig, DataSchema

MAX_REPORTED = 50
ROLES = ("system", "user", "assistant")
_TURNS_JSON = re.compile(r'^\s*\[\s*\{\s*"(role|content)"')
"""Text that opens like a JSON list of chat turns is parsed as one (and must be valid JSON)."""
_REFUSED = object()


class DataValidationError(ValueError):
    def __init__(self, problems: list[str], total: int | None = None):
        total = total if total is not None else len(problems)
        shown = problems[:MAX_REPORTED]
        more = f"\n  ... and {total - len(shown)} more" if total > len(shown) else ""
        super().__init__(f"{total} problem(s) in the input data:\n  " + "\n  ".join(shown) + more)
        self.problems = problems


class Problems:
    def __init__(self):
        self.items: list[str] = []

    def add(self, where: str, field: str | None, msg: str) -> None:
        self.items.append(f"{where}: field {field!r}: {msg}" if field else f"{where}: {msg}")

    def raise_if_any(self) -> None:
        if self.items:
            raise DataValidationError(self.items)


def _text(row: dict, field: str, where: str, problems: Problems, allow_number: bool = False,
          label: str | None = None) -> str | None:
    """The non-empty text in `row[field]`, or None with a problem recorded under `label` (default: field)."""
    label = label or field
    if field not in row or row[field] is None:
        problems.add(where, label, "missing")
        return None
    v = row[field]
    if allow_number and isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str):
        problems.add(where, label, f"expected text, got {type(v).__name__}")
        return None
    if not v.strip():
        problems.add(where, label, "empty text")
        return None
    return v


def _answer(text: str, marker: str, where: str, field: str, problems: Problems) -> str | None:
    if not marker:
        return text.strip()
    if marker not in text:
        problems.add(where, field, f"no {marker!r} marker before the final answer")
        return None
    ans = text.rsplit(marker, 1)[1].strip()
    if not ans:
        problems.add(where, field, f"nothing after the {marker!r} marker")
        return None
    return ans


def _check_prompt_len(n_chars: int, where: str, field: str, cfg: DataConfig, problems: Problems) -> None:
    if n_chars > cfg.max_prompt_chars:
        problems.add(where, field, f"prompt is {n_chars} characters, longer than "
                                   f"data.max_prompt_chars={cfg.max_prompt_chars}")


def _example(messages: list[dict], answer: str | None) -> dict:
    """The structured example every schema maps to (`task` "exact" when there is an answer to check)."""
    return {"messages": messages, "answer": answer, "task": "exact" if answer is not None else None}


def to_example(row: dict, where: str, cfg: DataConfig, problems: Problems, *,
               require_completion: bool) -> dict | None:
    """One validated structured example from a raw row, or None (problems recorded). Every column the schema
    does not consume is kept, JSON-ready, under "columns". `require_completion`: the conversation must end
    with an assistant turn (SFT will train on it)."""
    if cfg.schema == DataSchema.MESSAGES:
        consumed = {cfg.messages_field}
        ex = _messages_example(row, where, cfg, problems, require_completion)
    else:
        second = cfg.completion_field if cfg.schema == DataSchema.PROMPT_COMPLETION else cfg.answer_field
        consumed = {cfg.prompt_field, second} - {""}
        ex = _prompt_example(row, where, cfg, problems)
    columns = extra_columns(row, consumed, where, problems)
    if ex is None or columns is None:
        return None
    return {**ex, "columns": columns}


def _prompt_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """Schemas PROMPT_COMPLETION (SFT pairs) and PROMPT_ANSWER (prompts, with a reference answer unless
    `answer_field` is ""). A prompt is text (one user turn) or a list of {role, content} turns (or its JSON
    text); a completion is text (one assistant turn) or a list of assistant turns."""
    before = len(problems.items)
    prompt = _turns(row, cfg.prompt_field, "user", where, problems)
    completion, answer = None, None
    if cfg.schema == DataSchema.PROMPT_COMPLETION:
        completion = _turns(row, cfg.completion_field, "assistant", where, problems)
        for i, m in enumerate(completion or []):
            if m["role"] != "assistant":
                problems.add(where, f"{cfg.completion_field}[{i}].role",
                             f"a completion turn must be an assistant turn, got {m['role']!r}")
        if completion is not None and cfg.answer_marker:
            answer = _answer(completion[-1]["content"], cfg.answer_marker, where, cfg.completion_field, problems)
    elif cfg.answer_field:
        raw = _text(row, cfg.answer_field, where, problems, allow_number=True)
        if raw is not None:
            answer = _answer(raw, cfg.answer_marker, where, cfg.answer_field, problems)
    if prompt is not None:
        if cfg.schema == DataSchema.PROMPT_ANSWER and prompt[-1]["role"] == "assistant":
            problems.add(where, f"{cfg.prompt_field}[{len(prompt) - 1}].role",
                         "a prompt must not end with an assistant turn (it would be taken for the completion)")
        _check_prompt_len(sum(len(m["content"]) for m in prompt), where, cfg.prompt_field, cfg, problems)
    if len(problems.items) > before:
        return None
    return _example(prompt + (completion or []), answer)


def _messages_example(row: dict, where: str, cfg: DataConfig, problems: Problems,
                      require_completion: bool) -> dict | None:
    """Schema MESSAGES: a list of {role, content} turns (or its JSON text); a final assistant turn is the
    target, and with `answer_marker` set its text after the marker is the reference answer."""
    before = len(problems.items)
    turns = _message_list(row, where, cfg.messages_field, problems)
    if turns is None:
        return None
    clean = [_chat_turn(m, where, f"{cfg.messages_field}[{i}]", problems) for i, m in enumerate(turns)]
    if len(problems.items) > before:
        return None
    if require_completion and clean[-1]["role"] != "assistant":
        has_reply = any(m["role"] == "assistant" for m in clean)
        problems.add(where, cfg.messages_field,
                     (f"the chat ends with a {clean[-1]['role']!r} turn" if has_reply else "the chat has no assistant turn")
                     + "; SFT (sft.enabled true) trains on the final assistant turn: end each chat with one, or "
                       "set sft.enabled false for RL/eval-only prompt data")
        return None
    prompt_turns = clean[:-1] if clean[-1]["role"] == "assistant" else clean
    _check_prompt_len(sum(len(m["content"]) for m in prompt_turns), where, cfg.messages_field, cfg, problems)
    answer = None
    if cfg.answer_marker and clean[-1]["role"] == "assistant":
        answer = _answer(clean[-1]["content"], cfg.answer_marker, where, cfg.messages_field, problems)
    if len(problems.items) > before:
        return None
    return _example(clean, answer)


def _turns(row: dict, field: str, role: str, where: str, problems: Problems) -> list[dict] | None:
    """The turns in `row[field]`: text becomes one `role` turn; a list of {role, content} turns (or its JSON
    text, recognised by its opening `[{"role"` or `[{"content"`) is checked turn by turn."""
    v = row.get(field)
    if isinstance(v, str) and _TURNS_JSON.match(v):
        v = _message_list(row, where, field, problems)
        if v is None:
            return None
    if not isinstance(v, list):
        text = _text(row, field, where, problems)
        return None if text is None else [{"role": role, "content": text}]
    if not v:
        problems.add(where, field, "expected text or a non-empty list of {role, content} messages")
        return None
    before = len(problems.items)
    turns = [_chat_turn(m, where, f"{field}[{i}]", problems) for i, m in enumerate(v)]
    return None if len(problems.items) > before else turns


def _message_list(row: dict, where: str, field: str, problems: Problems) -> list | None:
    msgs = row.get(field)
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError:
            problems.add(where, field, "not a list of messages (invalid JSON text)")
            return None
    if msgs is None:
        problems.add(where, field, "missing")
        return None
    if not isinstance(msgs, list) or not msgs:
        problems.add(where, field, "expected a non-empty list of {role, content} messages")
        return None
    return msgs


def _chat_turn(m: object, where: str, label: str, problems: Problems) -> dict | None:
    """One {role, content} turn, problems recorded under `label` (e.g. "messages[2].role")."""
    if not isinstance(m, dict):
        problems.add(where, label, f"expected an object with role and content, got {type(m).__name__}")
        return None
    if m.get("role") not in ROLES:
        problems.add(where, f"{label}.role", f"invalid chat role {m.get('role')!r}; allowed: {list(ROLES)}")
    content = _text(m, "content", where, problems, label=f"{label}.content")
    return {"role": m.get("role"), "content": content}


def extra_columns(row: dict, consumed: set[str], where: str, problems: Problems) -> dict | None:
    """Every column of `row` not in `consumed`, as JSON-ready values; None if one cannot be stored."""
    out = {}
    for name in sorted(row):
        if name in consumed:
            continue
        if not isinstance(name, str):
            problems.add(where, repr(name), "column names must be text")
            return None
        out[name] = _json_value(row[name], where, name, problems)
    return None if any(v is _REFUSED for v in out.values()) else out


def _json_value(v: Any, where: str, label: str, problems: Problems) -> Any:
    """`v` as a JSON value (recursively), or _REFUSED with a problem recorded under `label`."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v):  # a missing value as CSV and parquet readers give it
            return None
        if math.isinf(v):
            problems.add(where, label, f"{v} cannot be stored as JSON; use a finite number, text or null")
            return _REFUSED
        return v
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):  # numpy scalars and arrays
        return _json_value(v.tolist(), where, label, problems)
    if isinstance(v, (list, tuple)):
        out = [_json_value(x, where, f"{label}[{i}]", problems) for i, x in enumerate(v)]
        return _REFUSED if any(x is _REFUSED for x in out) else out
    if isinstance(v, dict):
        bad = [k for k in v if not isinstance(k, str)]
        if bad:
            problems.add(where, label, f"object key {bad[0]!r} is not text; JSON object keys must be text")
            return _REFUSED
        out = {k: _json_value(x, where, f"{label}.{k}", problems) for k, x in v.items()}
        return _REFUSED if any(x is _REFUSED for x in out.values()) else out
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    problems.add(where, label, f"a value of type {type(v).__name__} cannot be stored as JSON; convert the column "
                               f"to text, numbers, booleans, lists or objects of those, or drop it")
    return _REFUSED
