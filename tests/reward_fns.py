"""User reward functions named by import path in tests (`tests.reward_fns:name`): one per call convention
and one per way a reward function can fail."""

import math
import os
import sys
import time

# ------------------------------------------------------------------ call conventions


def always_one(completion, answer, task):
    return 1.0


def exact(completion, answer):
    return float(completion.strip() == (answer or "").strip())


def uses_meta(prompt, completion, meta, messages):
    """Scores with a column (`meta`) and the prompt: 1 when the completion equals meta["target"]."""
    assert isinstance(messages, list) and messages[-1]["content"] == prompt
    return float(completion == str(meta["target"]))


def optional_column(completion, bonus=0.5):
    return 1.0 + bonus


def everything(**kwargs):
    """Reports which names it received: the sum of 2**i over the known names present."""
    known = ["prompt", "messages", "completion", "answer", "task", "meta", "level"]
    return sum(2 ** i for i, k in enumerate(known) if k in kwargs)


def batch_len(prompts, completions, answer, **kwargs):
    """TRL style: lists in, a list of the same length out."""
    assert len(prompts) == len(completions) == len(answer)
    return [float(len(c)) + (10.0 if a == c else 0.0) for c, a in zip(completions, answer)]


def batch_wrong_length(prompts, completions):
    return [1.0] * (len(completions) + 1)


def batch_hangs(prompts, completions):
    time.sleep(3600)


def first_token(prompt, completion, answer):
    """For the controller's fake toy task: the completion is space-separated token ids."""
    toks = completion.split()
    return float(bool(toks) and toks[0] == answer)


def fails_on_prompt_3(prompt, completion, answer):
    """Like first_token, but raises for every prompt whose last token is 3."""
    if prompt.split()[-1] == "3":
        raise ValueError(f"cannot score prompt {prompt!r}")
    return first_token(prompt, completion, answer)


def needs_missing(completion, not_a_column):
    return 1.0

# ------------------------------------------------------------------ failures


def raises(completion, answer, task):
    raise ValueError("broken reward function")


def exits(completion):
    sys.exit(3)


def dies(completion):
    os._exit(7)


def hangs(completion, answer, task):
    time.sleep(3600)
    return 1.0


def hangs_on_slow(completion):
    if completion == "slow":
        time.sleep(3600)
    return 1.0


def aborts(completion):
    """A crash by signal (SIGABRT), as a C extension's assertion would."""
    os.abort()


def allocates(completion):
    """Takes 300 MB when asked ("big"), else a little; keeps nothing."""
    block = bytearray((300 if completion == "big" else 1) * 2**20)
    return float(len(block) > 0)


def spins(completion):
    """Burns CPU for up to 60 s when asked ("spin")."""
    t = time.process_time()
    while completion == "spin" and time.process_time() - t < 60:
        pass
    return 1.0


def prints(completion):
    print(f"REWARD-STDOUT {completion}")
    return 1.0


def returns(completion):
    """Returns what the completion names: a way to test every kind of non-score."""
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "none": None, "str": "1.0", "true": True,
            "int": 2, "float": 0.25}[completion]


def pid(completion):
    return float(os.getpid())


# ------------------------------------------------------------------ a real third-party scorer


def reasoning_gym_score(completion, answer, metadata, **kwargs):
    """reasoning-gym's own scorer for the row's dataset (named in metadata["source_dataset"]); it reads the
    row's metadata (e.g. countdown checks the numbers used and the target), not only the reference answer."""
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(metadata["source_dataset"])(completion, {"answer": answer, "metadata": metadata})
