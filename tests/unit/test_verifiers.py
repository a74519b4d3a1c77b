"""The built-in verifiers (posttrain.data.verifiers): number parsing as documented, and no exception on any
text - a generated corpus of hostile strings (overflowing exponents, inf/nan, separators, markers, control
and non-ASCII characters) through every task."""

from __future__ import annotations

import random

import pytest

from posttrain.config import RewardConfig
from posttrain.data.verifiers import parse_number, score
from posttrain.rewards import RewardSample, RewardScorer

PIECES = ["####", "#", "0", "1", "7", "9", "12", "999", ",", ",000", ".", "e", "E", "e999", "e-999", "-", "+", "$",
          " ", "\n", "\t", "inf", "Infinity", "nan", "NaN", "1e999", "-1e999", "1_000", "0x1f", "\x00", "é", "٣",
          "１２", "½", "∞", "/", "*", "(", ")", "'", '"', "\\", "answer:", "1e9999999", "9" * 400]
TASKS = ["exact", "addition", "chain", None, "some_user_task"]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["", " ", *PIECES, *("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))) for _ in range(n))]


@pytest.mark.parametrize("got, answer, expected", [
    ("1,234", "1234", 1.0), ("1,234,567.50", "1234567.5", 1.0), ("$3", "3", 1.0), ("2.0", "2", 1.0),
    ("-.5", "-0.5", 1.0), ("1e3", "1000", 1.0), ("1e999", "10e998", 1.0), ("####  42 ", "42", 1.0),
    ("The answer is 4 #### 4", "4", 1.0), ("Paris", "paris", 1.0), ("a  b", "a b", 1.0),
    ("1,2", "12", 0.0),  # not a thousands grouping: text, so not the number 12
    ("12,34", "1234", 0.0), ("1e999", "1e998", 0.0), ("inf", "1e999", 0.0), ("2", "two", 0.0), ("", "0", 0.0),
])
def test_exact_number_parsing_is_as_documented(got, answer, expected):
    assert score("exact", got, answer) == expected


def test_parse_number_grammar():
    assert parse_number("1,234") == 1234 and parse_number(" -$1.5e2 ") == -150 and parse_number(".5") == 0.5
    for text in ["1,2", "1,2345", "inf", "nan", "1_000", "0x10", "1e", "$", "", "١٢", "１２", "1e1234567"]:
        assert parse_number(text) is None, text


def test_verifiers_never_raise_and_answer_zero_or_one():
    texts = corpus(4000)
    answers = [None, *corpus(200, seed=1)]
    rng = random.Random(2)
    for i, completion in enumerate(texts):
        for task in TASKS:
            answer = answers[i % len(answers)] if i % 3 else rng.choice(texts)
            assert score(task, completion, answer) in (0.0, 1.0), (task, completion, answer)


def test_every_text_equals_itself_under_exact():
    for text in corpus(1000):
        if text.strip() and "####" not in text:
            assert score("exact", text, text) == 1.0, repr(text)


def test_the_reward_scorer_scores_overflowing_answers_without_failures():
    """The strings that raised OverflowError before ("inf", "####1e999") score through the reward role's
    entry point with no failure recorded."""
    with RewardScorer(RewardConfig()) as s:
        got = s.score([RewardSample(completion=c, messages=[{"role": "user", "content": "q"}], answer=a,
                                    task="exact") for c, a in [("inf", "inf"), ("####1e999", "1e999"), ("x", "inf")]])
    assert [(r.score, r.failure) for r in got] == [(1.0, None), (1.0, None), (0.0, None)]
