"""The one row selector for the per-row records that cross Ray (rl/ragged.py::take_rows) and DAPO's concat."""

import pytest

from posttrain.rl.loops.dapo import concat
from posttrain.rl.ragged import take_rows
from posttrain.rl.roles.critic import CriticBatch
from posttrain.rl.types import PolicyLoss, PromptBatch, Scores, TrainBatch, Trajectories


def _traj(n: int, version: int = 3) -> Trajectories:
    return Trajectories(policy_version=version, group_index=[i // 2 for i in range(n)],
                        prompt_ids=[[i] for i in range(n)], response_ids=[[i, i] for i in range(n)],
                        logprobs=[[-0.1 * i] for i in range(n)], finished=[i % 2 == 0 for i in range(n)],
                        texts=[f"t{i}" for i in range(n)], answers=[str(i) for i in range(n)], tasks=[None] * n,
                        messages=[[{"role": "user", "content": str(i)}] for i in range(n)],
                        columns=[{"i": i} for i in range(n)], compute_s=1.5)


def test_take_rows_selects_every_list_field_in_order_and_keeps_the_rest():
    b = TrainBatch(policy_version=7, prompt_ids=[[1], [2], [3]], response_ids=[[4], [5, 6], [7]],
                   old_logprobs=[[-1.0], [-2.0, -2.5], [-3.0]], ref_logprobs=None, advantages=[0.5, -0.5, 1.0],
                   loss=PolicyLoss.GSPO)
    t = take_rows(b, [2, 0])
    assert t.prompt_ids == [[3], [1]] and t.response_ids == [[7], [4]] and t.old_logprobs == [[-3.0], [-1.0]]
    assert t.advantages == [1.0, 0.5] and t.ref_logprobs is None and t.loss == PolicyLoss.GSPO
    assert t.policy_version == 7
    p = PromptBatch(policy_version=1, example_ids=[10, 11, 12], prompt_ids=[[1], [2], [3]], answers=["a", "b", "c"],
                    tasks=[None] * 3, messages=[[], [], []], columns=[{}, {"x": 1}, {}])
    assert take_rows(p, range(1, 3)).example_ids == [11, 12] and take_rows(p, range(1, 3)).columns == [{"x": 1}, {}]
    c = CriticBatch(policy_version=2, prompt_ids=[[1], [2]], response_ids=[[3], [4]], old_values=[[0.1], [0.2]],
                    returns=[[1.0], [2.0]])
    assert take_rows(c, [1]) == CriticBatch(policy_version=2, prompt_ids=[[2]], response_ids=[[4]],
                                            old_values=[[0.2]], returns=[[2.0]])


def test_a_record_whose_lists_are_not_all_per_row_is_refused():
    s = Scores(policy_version=0, names=["a", "b"], sources=["x", "y"], scores=[[1.0], [2.0], [3.0]], compute_s=0.0)
    with pytest.raises(ValueError, match="Scores: list fields of different lengths"):
        take_rows(s, [0])


def test_dapo_concat_then_take_keeps_rows_and_distinct_groups():
    a, b = _traj(4), _traj(2)
    both = concat([a, b])
    assert both.group_index == [0, 0, 1, 1, 2, 2] and both.texts == ["t0", "t1", "t2", "t3", "t0", "t1"]
    assert both.compute_s == 3.0 and both.policy_version == 3
    tail = take_rows(both, [4, 5])
    assert tail.texts == ["t0", "t1"] and tail.group_index == [2, 2] and tail.prompt_ids == [[0], [1]]
    assert tail.columns == [{"i": 0}, {"i": 1}] and tail.finished == [True, False]
