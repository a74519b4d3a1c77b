"""What a failed torchrun run shows in a test's assertion message."""

from __future__ import annotations


def stderr_excerpt(err: str, head: int = 3000, tail: int = 4000) -> str:
    """A failed torchrun's stderr: its start (where a rank died - with PYTHONFAULTHANDLER=1 an aborted rank
    prints its Python stack there - and how far each rank got) and its end (torchrun's summary)."""
    if len(err) <= head + tail:
        return err
    return f"{err[:head]}\n[... {len(err) - head - tail} characters ...]\n{err[-tail:]}"
