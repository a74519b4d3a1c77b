"""The policy's learning-rate warm-up (`rl.warmup_steps`) is a function of the policy version alone."""

from posttrain.rl.roles.policy import warmup_scale


def test_linear_warmup_then_constant():
    assert [warmup_scale(v, 4) for v in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_no_warmup_is_constant():
    assert {warmup_scale(v, 0) for v in range(5)} == {1.0}


def test_resume_continues_the_schedule():
    # a run resumed at version 2 uses the same factor as the uninterrupted run's third update
    assert warmup_scale(2, 10) == 0.3
