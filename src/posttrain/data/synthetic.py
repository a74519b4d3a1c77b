"""Built-in verifiable tasks generated from a seed.

- `addition`: zero-padded operands, e.g. prompt "347+086=" -> completion "0433" (num_digits + 1 digits).
  With `demo_error_rate` r > 0 a share r of the demonstrations (chosen by the seed) comes from a "sloppy
  teacher" who drops the carry out of the highest digit ("647+586=" -> "0233" instead of "1233"), while the
  reference answer stays correct. About half of all problems have that carry, so SFT imitates a teacher
  who is wrong on them a share r of the time: with r > 0.5 its greedy answer to those is wrong and a sample
  is right with probability ~1 - r - a plateau SFT converges to, not a point on a steep learning curve -
  and RL with the verifier can correct it. (Dropping every carry instead kept a tiny model from learning
  the task at all within 1200 steps: measured.)
  As preference pairs (`data.schema: "preference"`, `addition_pairs`): the same problems, the correct sum
  chosen over the sloppy teacher's (the carry out of the highest digit dropped) - or, for a problem without that
  carry, over the sum with its last digit off by one.
- `chain`: `chain_steps` dependent operations applied left to right, e.g. prompt "7+5*2-9=" -> completion
  "12,24,15####15": every intermediate result, then the final answer after "####". Results stay in
  [0, 99] (`*` by a single digit, `-` never below zero, all mod 100), so a tiny model can learn it, yet the
  answer needs each step's result.
"""

from __future__ import annotations

import random


def _msgs(prompt: str, completion: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def overflow_sum(a: int, b: int, num_digits: int) -> str:
    """The sum with the carry out of the highest digit dropped, zero-padded: the sloppy teacher's answer."""
    return str((a + b) % 10**num_digits).zfill(num_digits + 1)


def addition(n: int, num_digits: int, seed: int, demo_error_rate: float = 0.0) -> list[dict]:
    rng = random.Random(f"addition-{seed}")
    sloppy = random.Random(f"addition-sloppy-{seed}")  # its own stream: the problems do not depend on the rate
    hi = 10 ** num_digits
    out = []
    for _ in range(n):
        a, b = rng.randrange(hi), rng.randrange(hi)
        ans = str(a + b).zfill(num_digits + 1)
        demo = overflow_sum(a, b, num_digits) if sloppy.random() < demo_error_rate else ans
        out.append({"messages": _msgs(f"{a:0{num_digits}d}+{b:0{num_digits}d}=", demo), "answer": ans,
                    "task": "addition"})
    return out


def addition_pairs(n: int, num_digits: int, seed: int) -> list[dict]:
    """Preference examples on `addition`'s problems (the same seed gives the same problems)."""
    out = []
    for ex in addition(n, num_digits, seed):
        prompt, ans = ex["messages"][0], ex["answer"]
        a, b = (int(x) for x in prompt["content"][:-1].split("+"))
        wrong = overflow_sum(a, b, num_digits)
        if wrong == ans:  # no carry out of the top digit: the last digit off by one
            wrong = ans[:-1] + str((int(ans[-1]) + 1) % 10)
        out.append({"messages": [prompt], "chosen": [{"role": "assistant", "content": ans}],
                    "rejected": [{"role": "assistant", "content": wrong}], "answer": ans, "task": "addition"})
    return out


def chain_solution(start: int, ops: list[tuple[str, int]]) -> list[int]:
    """Intermediate results of applying `ops` to `start`, left to right (no operator precedence)."""
    vals, x = [], start
    for op, v in ops:
        x = {"+": x + v, "-": x - v, "*": x * v}[op] % 100
        vals.append(x)
    return vals


def chain(n: int, steps: int, seed: int) -> list[dict]:
    rng = random.Random(f"chain-{seed}")
    out = []
    for _ in range(n):
        x = start = rng.randrange(1, 20)
        ops = []
        for _ in range(steps):
            op = rng.choice("+-*")
            v = rng.randrange(2, 10) if op == "*" else rng.randrange(1, 20)
            if op == "-" and v > x:
                op = "+"
            ops.append((op, v))
            x = chain_solution(x, [(op, v)])[0]
        vals = chain_solution(start, ops)
        prompt = str(start) + "".join(f"{op}{v}" for op, v in ops) + "="
        completion = ",".join(map(str, vals[:-1])) + f"####{vals[-1]}"
        out.append({"messages": _msgs(prompt, completion), "answer": str(vals[-1]), "task": "chain"})
    return out


TASKS = {"addition": lambda cfg: addition(cfg.num_examples, cfg.num_digits, cfg.seed, cfg.demo_error_rate),
         "chain": lambda cfg: chain(cfg.num_examples, cfg.chain_steps, cfg.seed)}
PAIR_TASKS = {"addition": lambda cfg: addition_pairs(cfg.num_examples, cfg.num_digits, cfg.seed)}
"""The built-in tasks that also come as preference pairs (data.schema "preference")."""
