"""The built-in Calculator with a tool that misbehaves on about a fifth of its calls, for the agent pipeline's
run-level test: by the digits of the expression (the same expression always does the same thing) it raises,
hangs past rl.episode.tool_timeout_s, exits its process, prints 10 MB before answering, or returns bytes that are
not UTF-8. Imported by import path (rl.environment = "flaky_env:FlakyCalculator", rl.episode.python_path =
[this folder]) in the workers' tool processes."""

from __future__ import annotations

import os
import time

from posttrain.envs.builtin import Calculator

KINDS = ("raised", "timeout", "died", "prints", "not_text")
"""What the tool does when `misbehaviour` picks it; "prints" still answers (prints are discarded, not failures)."""


def misbehaviour(expression: str) -> str | None:
    """The kind of failure this expression's call shows, or None (four calls in five)."""
    k = sum(int(c) for c in expression if c.isdigit()) % 25
    return KINDS[k] if k < len(KINDS) else None


class FlakyCalculator(Calculator):
    """Integer arithmetic as a tool that fails on about a fifth of its calls."""

    def calculate(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression.

        Args:
            expression: The expression, with integers, + - * // % and parentheses, e.g. "123 * 456".
        """
        kind = misbehaviour(expression)
        if kind == "raised":
            raise RuntimeError(f"flaky: {expression}")
        if kind == "timeout":
            time.sleep(600)
        if kind == "died":
            os._exit(3)
        if kind == "prints":
            print("x" * 10_000_000)
        if kind == "not_text":
            return b"\xff\xfe\xfd"  # type: ignore[return-value] - the failure under test
        return super().calculate(expression)
