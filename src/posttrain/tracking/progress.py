"""Progress for a log (no terminal needed): how far a loop is, how fast it goes and when it will end.

SFT, RL and eval print a line for the first unit of work, the last, every `tracking.log_every` units when that
is set, and otherwise whenever `tracking.progress_every_s` seconds have passed since the last line - so a
log (Flyte's, a pod's, `make run`'s) shows where a run is without flooding it. The rate is measured from the
first line on: it counts neither start-up (model load, compilation, Ray actors) nor the steps a resumed run
skipped, so the first line has no rate or ETA yet.
"""

from __future__ import annotations

import math
import time

PROGRESS_EVERY_S = 30.0
"""The pace where no `tracking.progress_every_s` is at hand (eval)."""


def duration(seconds: float) -> str:
    """'45s', '3m07s', '2h05m'."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total: int, *, every_s: float = PROGRESS_EVERY_S, log_every: int = 0, unit: str = "step",
                 clock=time.monotonic):
        """`total` units of work; `clock` is replaceable for tests."""
        self.total, self.every_s, self.log_every, self.unit = total, every_s, log_every, unit
        self._clock = clock
        self._first: tuple[float, int] | None = None
        """(time, units done) of the first line: where the rate is measured from."""
        self._last: float | None = None

    def due(self, done: int) -> bool:
        """Whether a line is due now that `done` units are finished."""
        if self._last is None or done >= self.total:
            return True
        if self.log_every and done % self.log_every == 0:
            return True
        return self._clock() - self._last >= self.every_s

    def stats(self, done: int) -> str:
        """'120/2000 (6%), 3.2 step/s, ETA 9m48s' ('1/2000 (0%)' on the first line) - and marks a line as
        printed now."""
        now = self._clock()
        self._last = now
        pct = 100.0 * done / self.total if self.total else 100.0
        text = f"{done}/{self.total} ({pct:.0f}%)"
        if self._first is None:
            self._first = (now, done)
            return text
        rate = (done - self._first[1]) / max(now - self._first[0], 1e-9)
        eta = (self.total - done) / rate if rate > 0 else math.inf
        return f"{text}, {rate:.3g} {self.unit}/s, ETA {duration(eta)}"
