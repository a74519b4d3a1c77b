"""Row validation: every problem names the file, the row (or line) and the field; all problems are
collected (up to a cap) and raised together, before anything is written."""

from __future__ import annotations

import json

from posttrain.config import DataConfig, DataSchema

MAX_REPORTED = 50
ROLES = ("system", "user", "assistant")


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


def to_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """One validated structured example from a raw row, or None (problems recorded)."""
    if cfg.schema == DataSchema.MESSAGES:
        return _messages_example(row, where, cfg, problems)
    return _prompt_example(row, where, cfg, problems)


def _prompt_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """Schemas PROMPT_COMPLETION (SFT pairs) and PROMPT_ANSWER (prompts with a reference answer)."""
    before = len(problems.items)
    prompt = _text(row, cfg.prompt_field, where, problems)
    completion, answer = None, None
    if cfg.schema == DataSchema.PROMPT_COMPLETION:
        completion = _text(row, cfg.completion_field, where, problems)
        if completion is not None and cfg.answer_marker:
            answer = _answer(completion, cfg.answer_marker, where, cfg.completion_field, problems)
    else:
        raw = _text(row, cfg.answer_field, where, problems, allow_number=True)
        if raw is not None:
            answer = _answer(raw, cfg.answer_marker, where, cfg.answer_field, problems)
    if prompt is not None:
        _check_prompt_len(len(prompt), where, cfg.prompt_field, cfg, problems)
    if len(problems.items) > before:
        return None
    msgs = [{"role": "user", "content": prompt}]
    if completion is not None:
        msgs.append({"role": "assistant", "content": completion})
    return _example(msgs, answer)


def _messages_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """Schema MESSAGES: a list of {role, content} turns (or its JSON text); a final assistant turn is the
    target, and with `answer_marker` set its text after the marker is the reference answer."""
    before = len(problems.items)
    turns = _message_list(row, where, cfg.messages_field, problems)
    if turns is None:
        return None
    clean = [_chat_turn(m, where, f"{cfg.messages_field}[{i}]", problems) for i, m in enumerate(turns)]
    if len(problems.items) > before:
        return None
    prompt_turns = clean[:-1] if clean[-1]["role"] == "assistant" else clean
    _check_prompt_len(sum(len(m["content"]) for m in prompt_turns), where, cfg.messages_field, cfg, problems)
    answer = None
    if cfg.answer_marker and clean[-1]["role"] == "assistant":
        answer = _answer(clean[-1]["content"], cfg.answer_marker, where, cfg.messages_field, problems)
    if len(problems.items) > before:
        return None
    return _example(clean, answer)


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
