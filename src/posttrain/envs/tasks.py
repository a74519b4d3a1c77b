"""Built-in tasks played in an environment (`data.task`): their problems and a sloppy teacher's demonstrations,
written turn by turn exactly as an episode renders them, so SFT trains on the tokens RL and evaluation then
sample (tools shown in the system turn by `posttrain.envs.calls.tools_block`, calls in the documented format,
results as tool-response turns).

- `calculator`: multiplication of two `data.num_digits`-digit numbers ("347*862="), which a tiny model cannot do
  in its head, with the `Calculator` environment's `calculate(expression)` tool
  (`rl.environment` / `eval.environment` "posttrain.envs.builtin:Calculator"). A demonstration calls the tool
  with the problem, reads the result and answers with it. The sloppy teacher (`data.demo_error_rate` r) skips
  the tool on a share r of the problems whose first factor starts with 5-9 (about 5/9 of them) and writes a
  mental estimate instead - each factor rounded to its leading digit, multiplied ("547*862=" -> "400000"),
  wrong almost always. With r > 0.5 SFT's greedy policy answers those problems in its head (wrong) and a
  sample calls the tool with probability ~1 - r: the same plateau the `addition` task's sloppy carry gives,
  which RL with the verifier corrects by learning when to use the tool. The reference answer is always the
  true product (verifier "exact").

The examples' prompt for an episode is the turns before the first assistant turn
(`posttrain.data.examples.episode_prompt`); the rest of each demonstration is what the environment and the
model said after it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from posttrain.config import DataConfig
from posttrain.envs.builtin import Calculator
from posttrain.envs.calls import render_call, response_turn, tools_block
from posttrain.envs.tools import environment_tools

CALCULATOR = "posttrain.envs.builtin:Calculator"
"""The environment the `calculator` task is played in (rl.environment / eval.environment)."""


def estimate(a: int, b: int) -> int:
    """The sloppy teacher's mental estimate: each factor rounded down to its leading digit, multiplied."""
    def lead(x: int) -> int:
        p = 10 ** (len(str(x)) - 1)
        return x // p * p
    return lead(a) * lead(b)


def calculator(n: int, num_digits: int, seed: int, demo_error_rate: float = 0.0) -> list[dict]:
    """`n` distinct problems (a, b), each with its demonstration; the problems do not depend on the rate."""
    rng = random.Random(f"calculator-{seed}")
    sloppy = random.Random(f"calculator-sloppy-{seed}")
    lo, hi = 10 ** (num_digits - 1), 10 ** num_digits
    if n > (hi - lo) ** 2 // 2:
        raise ValueError(f"calculator: {n} distinct problems asked of {num_digits}-digit factors")
    system = {"role": "system", "content": tools_block(environment_tools(Calculator, where="data.task calculator"))}
    seen, out = set(), []
    while len(out) < n:
        a, b = rng.randrange(lo, hi), rng.randrange(lo, hi)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        question = {"role": "user", "content": f"{a}*{b}="}
        product = str(a * b)
        if a >= 5 * lo and sloppy.random() < demo_error_rate:
            turns = [{"role": "assistant", "content": str(estimate(a, b))}]
        else:
            turns = [{"role": "assistant", "content": render_call("calculate", {"expression": f"{a}*{b}"})},
                     response_turn(product), {"role": "assistant", "content": product}]
        out.append({"messages": [system, question, *turns], "answer": product, "task": "exact"})
    return out


TASKS: dict[str, Callable[[DataConfig], list[dict]]] = {
    "calculator": lambda cfg: calculator(cfg.num_examples, cfg.num_digits, cfg.seed, cfg.demo_error_rate)}
"""The built-in environment tasks, by `data.task` name (the data stage adds them to posttrain.data's own)."""
