"""Row validation: every problem names the file, the row (or line) and the field; all problems are
collected (up to a cap) and raised together, before anything is written.

A row becomes {"messages", "answer", "task", "columns"} (a preference row also gets "chosen" and "rejected":
see posttrain.data.examples): the schema's fields make the chat turns and the reference answer; every other
column is kept under "columns" as JSON (NaN -> null, bytes -> {"base64": ...}, dates and times -> ISO 8601
text, decimals -> text); values of any other type, infinities and non-text object keys are refused, naming
the column. A reference-answer column not named "answer" (`answer_field: "solution"`) is also kept under its
own name, as the source value, so a reward function may name either `answer` or `solution`. Chat turns are
only system/user/assistant; tool calls and multimodal content are not supported.

Preference rows (schema PREFERENCE) come in TRL's three forms:
- text: `prompt` (one user turn), `chosen` and `rejected` (one assistant turn each);
- conversational, explicit prompt: `prompt` a list of turns (not ending with an assistant turn), `chosen` and
  `rejected` lists of one or more assistant turns;
- conversational, implicit prompt (no `prompt` column, or null in the row): `chosen` and `rejected` are whole
  conversations; the prompt is the turns they share, cut back to its last non-assistant turn (so shared
  assistant turns right before the first difference go with the continuations). The pair must then differ
  at an assistant turn, and each continuation is one or more assistant turns. A pair that differs in a
  user or system turn is refused: it answers two different prompts.
Lists may also be their JSON text (csv). Chosen identical to rejected is refused. The reference answer is the
`answer_field` column when the row has it (with `answer_marker` applied), else None.
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
    match cfg.schema:
        case DataSchema.MESSAGES:
            consumed = {cfg.messages_field}
            ex = _messages_example(row, where, cfg, problems, require_completion)
        case DataSchema.PREFERENCE:
            consumed = {cfg.prompt_field, cfg.chosen_field, cfg.rejected_field, cfg.answer_field}
            ex = _preference_example(row, where, cfg, problems)
        case DataSchema.PROMPT_COMPLETION:
            consumed = {cfg.prompt_field, cfg.completion_field, cfg.answer_field}
            ex = _prompt_example(row, where, cfg, problems)
        case _:
            consumed = {cfg.prompt_field, cfg.answer_field}
            ex = _prompt_example(row, where, cfg, problems)
    if cfg.answer_field != "answer":  # kept under its own name too (the reserved `answer` is the reference)
        consumed.discard(cfg.answer_field)
    columns = extra_columns(row, consumed - {""}, where, problems)
    if ex is None or columns is None:
        return None
    return {**ex, "columns": columns}


def _prompt_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """Schemas PROMPT_COMPLETION (SFT pairs; the reference answer is the row's `answer_field` where it has one,
    else the text after `answer_marker` in the completion) and PROMPT_ANSWER (prompts, with a reference answer unless
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
        if cfg.answer_field and row.get(cfg.answer_field) is not None:  # a reference answer beside the reply
            raw = _text(row, cfg.answer_field, where, problems, allow_number=True)
            if raw is not None:
                answer = _answer(raw, cfg.answer_marker, where, cfg.answer_field, problems)
        elif completion is not None and cfg.answer_marker:
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


def _preference_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """Schema PREFERENCE: prompt turns + chosen and rejected continuations (module docstring: the three forms)."""
    before = len(problems.items)
    chosen = _turns(row, cfg.chosen_field, "assistant", where, problems)
    rejected = _turns(row, cfg.rejected_field, "assistant", where, problems)
    answer = None
    if cfg.answer_field and row.get(cfg.answer_field) is not None:
        raw = _text(row, cfg.answer_field, where, problems, allow_number=True)
        if raw is not None:
            answer = _answer(raw, cfg.answer_marker, where, cfg.answer_field, problems)
    explicit = bool(cfg.prompt_field) and row.get(cfg.prompt_field) is not None  # else TRL's implicit prompt
    if explicit:
        prompt = _turns(row, cfg.prompt_field, "user", where, problems)
        if prompt is not None and prompt[-1]["role"] == "assistant":
            problems.add(where, f"{cfg.prompt_field}[{len(prompt) - 1}].role",
                         "a prompt must not end with an assistant turn (it would be taken for the completion)")
        for field, turns in ((cfg.chosen_field, chosen), (cfg.rejected_field, rejected)):
            if prompt is not None and turns is not None and turns[:len(prompt)] == prompt:
                problems.add(where, field, f"repeats the {cfg.prompt_field!r} turns; give only the continuation, or "
                                           f"leave out {cfg.prompt_field!r} (the turns chosen and rejected share are "
                                           "then the prompt)")
            else:
                _only_assistant(turns or [], 0, field, where, problems)
    elif chosen is None or rejected is None:
        prompt = None
    elif not (_is_turn_list(row[cfg.chosen_field]) and _is_turn_list(row[cfg.rejected_field])):
        prompt = None
        problems.add(where, cfg.prompt_field or cfg.chosen_field,
                     "missing: text chosen/rejected need a prompt (without one, chosen and rejected must be "
                     "lists of {role, content} turns that share their prompt turns)")
    else:
        prompt, chosen, rejected = _shared_prompt(chosen, rejected, where, cfg, problems)
    if prompt is not None:  # named after the column that holds it: `prompt_field`, or chosen's shared turns
        _check_prompt_len(sum(len(m["content"]) for m in prompt), where,
                          cfg.prompt_field if explicit else cfg.chosen_field, cfg, problems)
    if len(problems.items) == before and chosen == rejected:
        problems.add(where, cfg.rejected_field, f"identical to {cfg.chosen_field!r}; a preference pair needs two "
                                                "different completions")
    if len(problems.items) > before:
        return None
    return {**_example(prompt, answer), "chosen": chosen, "rejected": rejected}


def _shared_prompt(chosen: list[dict], rejected: list[dict], where: str, cfg: DataConfig, problems: Problems
                   ) -> tuple[list[dict] | None, list[dict], list[dict]]:
    """TRL's implicit prompt: (prompt, chosen continuation, rejected continuation) of two whole conversations.
    The prompt is their longest common prefix of turns, cut back to its last non-assistant turn."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    k = n
    while k > 0 and chosen[k - 1]["role"] == "assistant":
        k -= 1
    label = cfg.prompt_field or cfg.chosen_field
    if chosen == rejected:
        return chosen, [], []  # refused by the caller as identical
    if k == 0:
        problems.add(where, label, "missing, and chosen and rejected share no opening user or system turn to take "
                                   "as the prompt; give a prompt column or start both with the same prompt turns")
        return None, chosen, rejected
    pairs = ((cfg.chosen_field, chosen, cfg.rejected_field), (cfg.rejected_field, rejected, cfg.chosen_field))
    for field, turns, _ in pairs:
        if n < len(turns) and turns[n]["role"] != "assistant":
            problems.add(where, f"{field}[{n}].role",
                         f"chosen and rejected first differ at this {turns[n]['role']!r} turn; a preference pair "
                         "shares its prompt turns and differs only in the assistant's reply")
            return None, chosen, rejected
    for field, turns, other in pairs:
        if len(turns) == k:
            problems.add(where, field, f"no assistant turn after the prompt turns it shares with {other!r}")
        _only_assistant(turns, k, field, where, problems)
    return chosen[:k], chosen[k:], rejected[k:]


def _only_assistant(turns: list[dict], start: int, field: str, where: str, problems: Problems) -> None:
    """Every turn of a continuation (`turns[start:]`) must be an assistant turn."""
    for i in range(start, len(turns)):
        if turns[i]["role"] != "assistant":
            problems.add(where, f"{field}[{i}].role",
                         f"a completion turn must be an assistant turn, got {turns[i]['role']!r}")


def _is_turn_list(v: object) -> bool:
    """A list of turns, or its JSON text (as `_turns` reads it), rather than plain text."""
    return isinstance(v, list) or (isinstance(v, str) and bool(_TURNS_JSON.match(v)))


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
