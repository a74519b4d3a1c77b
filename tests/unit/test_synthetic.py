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


def test_addition_as_pairs_puts_the_correct_sum_over_a_wrong_one():
    from posttrain.data.synthetic import addition, addition_pairs, overflow_sum
    from posttrain.data.verifiers import score

    pairs, plain = addition_pairs(400, 2, seed=3), addition(400, 2, seed=3)
    assert [p["messages"][0] for p in pairs] == [e["messages"][0] for e in plain]  # the same problems
    for p in pairs:
        chosen, rejected = p["chosen"][0]["content"], p["rejected"][0]["content"]
        assert score("addition", chosen, p["answer"]) == 1.0 and score("addition", rejected, p["answer"]) < 1.0
        a, b = (int(x) for x in p["messages"][0]["content"][:-1].split("+"))
        assert rejected == overflow_sum(a, b, 2) or a + b < 100  # the sloppy teacher's answer where it is wrong
    assert sum(a + b >= 100 for a, b in ((int(x) for x in p["messages"][0]["content"][:-1].split("+"))
                                         for p in pairs)) > 100


def test_a_builtin_task_as_preference_data_is_checked():
    import pytest

    from posttrain.config import ConfigError
    from posttrain.recipes import resolve

    resolve("tiny_cpu", {"data": {"schema": "preference", "demo_error_rate": 0.0}})
    with pytest.raises(ConfigError, match="data.demo_error_rate: the 'addition' pairs"):
        resolve("tiny_cpu", {"data": {"schema": "preference"}})
    with pytest.raises(ConfigError, match="data.schema: 'preference' with a built-in task: only 'addition'"):
        resolve("tiny_chain", {"data": {"schema": "preference"}})
