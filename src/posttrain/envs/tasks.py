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
- `calculator_lazy`: the same problems and tool, but the lazy teacher skips the tool on a share r of ALL the
  problems, whatever their factors: a model that imitates it skips the tool with probability ~r on any problem
  (greedy decoding may still call it: the estimates' first tokens spread over several digits, the call opens
  with one - SmolLM2 after SFT at r 0.6 called it on 174 of 200 problems greedy, in 23% of episodes sampled).
  For a pretrained model with a few hundred
  demonstrations (small_instruct_calculator_cpu), where `calculator`'s rule by leading digit is not picked up:
  SmolLM2 after SFT on `calculator` at r 0.6 called the tool on every problem, leaving RL nothing to add.
- `guess_number`: the `GuessNumber` game on 1-32 (`rl.environment` / `eval.environment`
  "posttrain.envs.builtin:GuessNumber"): the model guesses, the environment answers "higher" / "lower", for at
  most 7 guesses - binary search's worst case on 32 numbers (6) plus one. A demonstration opens on the game's
  own first observation and plays a whole game. Every guesser starts at 16; the careful one then halves the
  range (solves every game within 6 guesses), the sloppy one (a share `data.demo_error_rate` of the games)
  steps by one from there (solves only 10-22 within 7). With r > 0.5 SFT's greedy policy steps (~13/32
  solved) while a sample halves with probability ~1 - r; RL, rewarded by the verifier on the final guess and
  the game's own reward (more for fewer guesses), learns to halve after the first answer. Every game opens
  with the same prompt (the secret is hidden), so there is nothing to hold out by prompt: the eval split is
  the task's own, every secret of the range in turn (`data.eval_size` games), and the demonstrations repeat
  by design (one per secret and guesser), so the task is refused with `data.dedupe` true.

The examples' prompt for an episode is the turns before the first assistant turn
(`posttrain.data.examples.episode_prompt`); the rest of each demonstration is what the environment and the
model said after it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from posttrain.config import DataConfig
from posttrain.data.prepare import TaskSplit
from posttrain.envs.builtin import Calculator, GuessNumber
from posttrain.envs.calls import render_call, response_turn, tools_block
from posttrain.envs.tools import environment_tools

CALCULATOR = "posttrain.envs.builtin:Calculator"
"""The environment the `calculator` task is played in (rl.environment / eval.environment)."""
GUESS_NUMBER = "posttrain.envs.builtin:GuessNumber"
"""The environment the `guess_number` task is played in."""
GUESS_LOW, GUESS_HIGH, GUESS_FIRST = 1, 32, 16
GUESS_TURNS = 7
"""guess_number's range, every guesser's first guess, and the guesses a game allows: binary search's worst
case on the range (6) plus one."""


def estimate(a: int, b: int) -> int:
    """The sloppy teacher's mental estimate: each factor rounded down to its leading digit, multiplied."""
    def lead(x: int) -> int:
        p = 10 ** (len(str(x)) - 1)
        return x // p * p
    return lead(a) * lead(b)


def calculator(n: int, num_digits: int, seed: int, demo_error_rate: float = 0.0, lazy: bool = False) -> list[dict]:
    """`n` distinct problems (a, b), each with its demonstration; the problems do not depend on the rate. The
    teacher skips the tool on a share `demo_error_rate` of the problems whose first factor starts with 5-9, or,
    `lazy`, of every problem (`calculator_lazy`)."""
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
        if (lazy or a >= 5 * lo) and sloppy.random() < demo_error_rate:
            turns = [{"role": "assistant", "content": str(estimate(a, b))}]
        else:
            turns = [{"role": "assistant", "content": render_call("calculate", {"expression": f"{a}*{b}"})},
                     response_turn(product), {"role": "assistant", "content": product}]
        out.append({"messages": [system, question, *turns], "answer": product, "task": "exact"})
    return out


def guess_game(secret: int, sloppy: bool) -> list[int]:
    """The guesses of one game: 16 first, then the careful guesser halves the range left and the sloppy one
    steps by one towards the secret; at most GUESS_TURNS of them, the last the secret where it was found."""
    lo, hi, guess, guesses = GUESS_LOW, GUESS_HIGH, GUESS_FIRST, []
    while True:
        guesses.append(guess)
        if guess == secret or len(guesses) == GUESS_TURNS:
            return guesses
        if guess < secret:
            lo = guess + 1
        else:
            hi = guess - 1
        guess = (guess + (1 if guess < secret else -1)) if sloppy else (lo + hi) // 2


def guess_number(n: int, eval_size: int, seed: int, demo_error_rate: float = 0.0) -> TaskSplit:
    """`n` demonstrated games with random secrets; the eval games are the secrets of the range in turn."""
    rng = random.Random(f"guess-number-{seed}")
    row = {"low": GUESS_LOW, "high": GUESS_HIGH, "max_turns": GUESS_TURNS}
    opening = [{"role": "user", "content": GuessNumber().reset(secret=GUESS_LOW, **row)}]
    train = []
    for _ in range(n):
        secret = rng.randint(GUESS_LOW, GUESS_HIGH)
        game = GuessNumber()
        game.reset(secret=secret, **row)
        turns = []
        for guess in guess_game(secret, sloppy=rng.random() < demo_error_rate):
            turns.append({"role": "assistant", "content": str(guess)})
            if not game.step(str(guess))["done"]:
                turns.append({"role": "user", "content": "higher" if guess < secret else "lower"})
        train.append({"messages": opening + turns, "answer": str(secret), "task": "exact",
                      "columns": {**row, "secret": secret}})
    span = GUESS_HIGH - GUESS_LOW + 1
    held = [{"messages": list(opening), "answer": str(GUESS_LOW + i % span), "task": "exact",
             "columns": {**row, "secret": GUESS_LOW + i % span}} for i in range(eval_size)]
    return TaskSplit(train=train, eval=held)


TASKS: dict[str, Callable[[DataConfig], list[dict] | TaskSplit]] = {
    "calculator": lambda cfg: calculator(cfg.num_examples, cfg.num_digits, cfg.seed, cfg.demo_error_rate),
    "calculator_lazy": lambda cfg: calculator(cfg.num_examples, cfg.num_digits, cfg.seed, cfg.demo_error_rate,
                                              lazy=True),
    "guess_number": lambda cfg: guess_number(cfg.num_examples, cfg.eval_size, cfg.seed, cfg.demo_error_rate)}
"""The built-in environment tasks, by `data.task` name (the data stage adds them to posttrain.data's own)."""
