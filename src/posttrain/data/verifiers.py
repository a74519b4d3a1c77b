"""Verifiers: does a completion answer the problem? Each returns 1.0 or 0.0.

- addition: the completion (whitespace stripped) equals the zero-padded answer.
- chain: the text after the last "####" equals the answer (intermediate steps are not graded).
- exact: normalised match for user data (whitespace collapsed; numbers compared numerically, commas and a
  trailing ".0" ignored), also after a "####" marker when the completion has one (GSM8K).
"""

from __future__ import annotations

import re


def extract_answer(task: str | None, completion: str) -> str | None:
    text = completion.strip()
    if task == "addition":
        return text or None
    if "####" in text:
        return text.rsplit("####", 1)[1].strip() or None
    return None if task == "chain" else (text or None)


def _norm(s: str) -> str:
    s = re.sub(r"\s+", " ", s.strip())
    num = s.replace(",", "").replace("$", "")
    try:
        f = float(num)
        return repr(int(f)) if f == int(f) else repr(f)
    except ValueError:
        return s.lower()


def score(task: str | None, completion: str, answer: str | None) -> float:
    if answer is None:
        return 0.0
    got = extract_answer(task, completion)
    if got is None:
        return 0.0
    if task in ("addition", "chain"):
        return float(got == answer.strip())
    return float(_norm(got) == _norm(answer))
