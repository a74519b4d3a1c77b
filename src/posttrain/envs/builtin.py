"""The built-in environments, written against the same convention a user's are (`posttrain.envs.host`):

- `Calculator`: one tool, `calculate(expression)`, for problems the tiny model cannot do in its head
  (multi-digit multiplication); arithmetic only, evaluated from the parsed expression tree - never `eval`.
- `GuessNumber`: a truly multi-turn game without tools: the model guesses, the environment answers
  "higher" / "lower" until it is right or the turns run out; the reward is more for fewer turns, so credit
  per turn matters.
"""

from __future__ import annotations

import ast
import operator
import re

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_DIGITS = 60
"""Operands and results longer than this are refused (a tool that computes 9**9**9 would hang the process)."""


def evaluate(expression: str) -> int:
    """An integer arithmetic expression (+ - * // % and parentheses), from its syntax tree."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            value = _OPS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.operand))
        else:
            raise ValueError(f"only integers, + - * // % and parentheses are allowed: {expression!r}")
        if len(str(abs(value))) > MAX_DIGITS:
            raise ValueError(f"a number longer than {MAX_DIGITS} digits")
        return value

    return walk(tree)


class Calculator:
    """Integer arithmetic as a tool."""

    def calculate(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression.

        Args:
            expression: The expression, with integers, + - * // % and parentheses, e.g. "123 * 456".
        """
        return str(evaluate(expression))


class GuessNumber:
    """Guess the secret number: after each guess the environment says "higher", "lower" or "correct"."""

    def reset(self, low: int, high: int, secret: int, max_turns: int, **_row) -> str:
        if not low <= secret <= high or max_turns < 1:
            raise ValueError(f"a guess_number row needs low <= secret <= high and max_turns >= 1, "
                             f"got {low}, {secret}, {high}, {max_turns}")
        self.low, self.high, self.secret, self.max_turns = low, high, secret, max_turns
        self.turns, self.solved = 0, False
        return f"Guess the number between {low} and {high}. You have {max_turns} guesses."

    def step(self, text: str) -> dict:
        self.turns += 1
        found = re.findall(r"-?\d+", text)
        left = self.max_turns - self.turns
        if not found:
            obs = "Answer with a number."
        else:
            guess = int(found[-1])
            self.solved = guess == self.secret
            obs = "correct" if self.solved else ("higher" if guess < self.secret else "lower")
        return {"observation": obs, "done": self.solved or left <= 0}

    def get_reward(self) -> float:
        """1 for a solve on the first guess, less for each further guess; 0 unsolved."""
        if not self.solved:
            return 0.0
        return 1.0 - 0.5 * (self.turns - 1) / max(self.max_turns - 1, 1)
