"""Verifiers: does a completion answer the problem? Each returns 1.0 or 0.0 and never raises, whatever the
text (tests/unit/test_verifiers.py runs them on a generated corpus of hostile strings).

- addition: the completion (whitespace stripped) equals the zero-padded answer.
- chain: the text after the last "####" equals the answer (intermediate steps are not graded).
- exact: normalised match for user data, also after a "####" marker when the completion has one (GSM8K):
  whitespace collapsed, case ignored; when both sides are NUMBERS they compare by value. A number is, in
  full (`NUMBER` below): an optional sign, an optional "$", digits with an optional decimal part and
  exponent ("2", "-0.50", "$3", "1e3", ".5"); thousands separators only as well-formed groups of three
  ("1,234,567", not "1,2" - which stays text, so it does not equal "12"). Values compare exactly as decimals
  (no float rounding, no overflow: "1e999" is a number equal to "10e998"); "inf" and "nan" are text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

NUMBER = re.compile(r"([+-]?)\$?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,6}))?", re.ASCII)
"""A whole-string number for the exact verifier: sign, "$", digits (grouped by commas in threes, or not),
decimal part, exponent of at most 6 digits."""


def extract_answer(task: str | None, completion: str) -> str | None:
    text = completion.strip()
    if task == "addition":
        return text or None
    if "####" in text:
        return text.rsplit("####", 1)[1].strip() or None
    return None if task == "chain" else (text or None)


def parse_number(text: str) -> Decimal | None:
    """The value of `text` if all of it is a NUMBER, else None."""
    m = NUMBER.fullmatch(text.strip())
    if m is None:
        return None
    sign, digits, exponent = m.groups()
    try:
        return Decimal(f"{sign}{digits.replace(',', '')}e{exponent or 0}")
    except InvalidOperation:  # not expected for a NUMBER match; text then
        return None


def _norm(s: str) -> Decimal | str:
    s = re.sub(r"\s+", " ", s.strip())
    value = parse_number(s)
    return value if value is not None else s.lower()


def score(task: str | None, completion: str, answer: str | None) -> float:
    if answer is None:
        return 0.0
    got = extract_answer(task, completion)
    if got is None:
        return 0.0
    if task in ("addition", "chain"):
        return float(got == answer.strip())
    a, b = _norm(got), _norm(answer)
    return float(type(a) is type(b) and a == b)
