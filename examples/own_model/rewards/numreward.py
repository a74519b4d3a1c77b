"""The example's reward functions: plain Python, named in the settings as `numreward:FUNCTION` with this folder on
`reward.python_path`. Each gets a completion and the row's columns it names (here `answer`) and returns a float."""

import re


def number_in_reply(completion, answer):
    """1.0 when the reference answer is one of the numbers in the reply ("7 + 8 = 15" answers 15)."""
    return float(answer in re.findall(r"-?\d+", completion))


def number_then_brevity(completion, answer):
    """The number check plus a small bonus for brevity: samples of one prompt almost never tie, so GRPO's
    advantages are not all zero even when every sample is right or every one wrong."""
    return number_in_reply(completion, answer) + 1.0 / (1 + len(completion))
