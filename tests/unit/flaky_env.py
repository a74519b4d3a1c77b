"""An environment whose tools misbehave on purpose, for tests/unit/test_envs.py (imported by import path in
the tool process, as a user's environment is)."""

from __future__ import annotations

import os
import sys
import time


class Counter:
    """Counts its calls; its tools fail in every way a tool can."""

    def reset(self, start: int = 0, **_row) -> str:
        self.count = start
        return f"counting from {start}"

    def add(self, n: int) -> str:
        """Add to the count.

        Args:
            n: How much to add.
        """
        self.count += n
        return str(self.count)

    def hang(self) -> str:
        """Never returns."""
        time.sleep(3600)
        return ""

    def exit(self) -> str:
        """Ends the process."""
        os._exit(3)

    def raises(self) -> str:
        """Raises."""
        raise KeyError("no such thing")

    def flood(self) -> str:
        """Prints 10 MB, returns a long text."""
        sys.stdout.write("x" * 10_000_000)
        sys.stdout.flush()
        return "y" * 200_000

    def binary(self) -> bytes:
        """Returns bytes that are not UTF-8."""
        return b"\xff\xfe\x00ok"

    def hog(self) -> str:
        """Allocates far more memory than allowed."""
        return str(len(bytearray(2**31)))

    def get_reward(self) -> float:
        return float(self.count)


def shout(text: str) -> str:
    """Upper-cases a text.

    Args:
        text: The text.
    """
    return text.upper()


def undocumented(text: str) -> str:
    return text
