"""Row validation: every problem names the file, the row (or line) and the field; all problems are
collected (up to a cap) and raised together, before anything is written."""

from __future__ import annotations

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


def _text(row: dict, field: str, where: str, problems: Problems, allow_number: bool = False) -> str | None:
    if field not in row or row[field] is None:
        problems.add(where, field, "missing")
        return None
    v = row[field]
    if allow_number and isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str):
        problems.add(where, field, f"expected text, got {type(v).__name__}")
        return None
    if not v.strip():
        problems.add(where, field, "empty text")
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


def to_example(row: dict, where: str, cfg: DataConfig, problems: Problems) -> dict | None:
    """One validated structured example from a raw row, or None (problems recorded)."""
    before = len(problems.items)
    if cfg.schema == DataSchema.MESSAGES:
        msgs = row.get(cfg.messages_field)
        if isinstance(msgs, str):
            import json

            try:
                msgs = json.loads(msgs)
            except json.JSONDecodeError:
                problems.add(where, cfg.messages_field, "not a list of messages (invalid JSON text)")
                return None
        if msgs is None:
            problems.add(where, cfg.messages_field, "missing")
            return None
        if not isinstance(msgs, list) or not msgs:
            problems.add(where, cfg.messages_field, "expected a non-empty list of {role, content} messages")
            return None
        clean = []
        for i, m in enumerate(msgs):
            f = f"{cfg.messages_field}[{i}]"
            if not isinstance(m, dict):
                problems.add(where, f, f"expected an object with role and content, got {type(m).__name__}")
                continue
            if m.get("role") not in ROLES:
                problems.add(where, f"{f}.role", f"invalid chat role {m.get('role')!r}; allowed: {list(ROLES)}")
            c = _text(m, "content", where, problems)
            if c is None:
                problems.items[-1] = problems.items[-1].replace("'content'", repr(f"{f}.content"))
            clean.append({"role": m.get("role"), "content": c})
        if len(problems.items) > before:
            return None
        prompt_len = sum(len(m["content"]) for m in (clean[:-1] if clean[-1]["role"] == "assistant" else clean))
        if prompt_len > cfg.max_prompt_chars:
            problems.add(where, cfg.messages_field, f"prompt is {prompt_len} characters, longer than "
                                                    f"data.max_prompt_chars={cfg.max_prompt_chars}")
            return None
        answer = None
        if cfg.answer_marker and clean[-1]["role"] == "assistant":
            answer = _answer(clean[-1]["content"], cfg.answer_marker, where, cfg.messages_field, problems)
        return {"messages": clean, "answer": answer, "task": "exact" if answer else None}

    prompt = _text(row, cfg.prompt_field, where, problems)
    if cfg.schema == DataSchema.PROMPT_COMPLETION:
        completion = _text(row, cfg.completion_field, where, problems)
        answer = (_answer(completion, cfg.answer_marker, where, cfg.completion_field, problems)
                  if completion is not None and cfg.answer_marker else None)
    else:
        completion = None
        raw = _text(row, cfg.answer_field, where, problems, allow_number=True)
        answer = _answer(raw, cfg.answer_marker, where, cfg.answer_field, problems) if raw is not None else None
    if prompt is not None and len(prompt) > cfg.max_prompt_chars:
        problems.add(where, cfg.prompt_field, f"prompt is {len(prompt)} characters, longer than "
                                              f"data.max_prompt_chars={cfg.max_prompt_chars}")
    if len(problems.items) > before:
        return None
    msgs = [{"role": "user", "content": prompt}]
    if completion is not None:
        msgs.append({"role": "assistant", "content": completion})
    return {"messages": msgs, "answer": answer, "task": "exact" if answer is not None else None}
