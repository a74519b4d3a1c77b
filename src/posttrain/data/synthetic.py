"""Built-in verifiable tasks generated from a seed.

- `addition`: zero-padded operands, e.g. prompt "347+086=" -> completion "0433" (num_digits + 1 digits).
- `chain`: `chain_steps` dependent operations applied left to right, e.g. prompt "7+5*2-9=" -> completion
  "12,24,15####15": every intermediate result, then the final answer after "####". Results stay in
  [0, 99] (`*` by a single digit, `-` never below zero, all mod 100), so a tiny model can learn it, yet the
  answer needs each step's result.
"""

from __future__ import annotations

import random


def _msgs(prompt: str, completion: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def addition(n: int, num_digits: int, seed: int) -> list[dict]:
    rng = random.Random(f"addition-{seed}")
    hi = 10 ** num_digits
    out = []
    for _ in range(n):
        a, b = rng.randrange(hi), rng.randrange(hi)
        ans = str(a + b).zfill(num_digits + 1)
        out.append({"messages": _msgs(f"{a:0{num_digits}d}+{b:0{num_digits}d}=", ans), "answer": ans,
                    "task": "addition"})
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


TASKS = {"addition": lambda cfg: addition(cfg.num_examples, cfg.num_digits, cfg.seed),
         "chain": lambda cfg: chain(cfg.num_examples, cfg.chain_steps, cfg.seed)}
