"""User reward functions named by import path in tests (`module:function`)."""

import time


def always_one(completion, answer, task):
    return 1.0


def exact(completion, answer, task):
    return float(completion.strip() == (answer or "").strip())


def raises(completion, answer, task):
    raise ValueError("broken reward function")


def hangs(completion, answer, task):
    time.sleep(3600)
    return 1.0
