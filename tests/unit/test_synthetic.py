"""The built-in addition task's sloppy teacher (data.demo_error_rate): which demonstrations are wrong, how,
and that the reference answers - what the verifier checks - never are."""

from __future__ import annotations

from posttrain.data.synthetic import addition, overflow_sum
from posttrain.data.verifiers import score


def test_overflow_sum_drops_only_the_carry_out_of_the_top_digit():
    assert overflow_sum(647, 586, 3) == "0233"  # 1233 without its leading carry
    assert overflow_sum(347, 86, 3) == "0433"   # no carry out: the correct answer
    assert overflow_sum(999, 999, 3) == "0998"


def test_sloppy_demonstrations_keep_correct_answers_and_the_same_problems():
    clean = addition(4000, 3, seed=5)
    sloppy = addition(4000, 3, seed=5, demo_error_rate=0.6)
    assert [e["messages"][0] for e in clean] == [e["messages"][0] for e in sloppy]  # same prompts
    assert [e["answer"] for e in clean] == [e["answer"] for e in sloppy]
    assert all(e["messages"][1]["content"] == e["answer"] for e in clean)
    wrong = [e for e in sloppy if e["messages"][1]["content"] != e["answer"]]
    overflowing = [e for e in sloppy if e["answer"][0] == "1"]
    # Only problems with a carry out of the top digit can be wrong, about 60% of them are, and the verifier
    # scores every wrong demonstration 0 against the reference answer.
    assert all(e["answer"][0] == "1" and e["messages"][1]["content"] == "0" + e["answer"][1:] for e in wrong)
    assert 0.55 < len(wrong) / len(overflowing) < 0.65
    assert all(score("addition", e["messages"][1]["content"], e["answer"]) == 0.0 for e in wrong)
    assert addition(4000, 3, seed=5, demo_error_rate=0.6) == sloppy  # deterministic
