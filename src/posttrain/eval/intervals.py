"""Confidence intervals for the numbers evaluations report and the pages show: a proportion's (Wilson) and the
change of a proportion measured twice on the same problems (Newcombe's paired interval, McNemar's exact test)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
"""Two-sided 95% normal quantile."""


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (default 95%) of a proportion `successes / n`: unlike the normal approximation it
    stays inside [0, 1] and is not degenerate at 0 or n successes (an accuracy of 0/20 still has an upper
    bound). `successes` may be fractional (a mean over samples scaled to n). (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)



@dataclass(frozen=True, kw_only=True)
class PairedChange:
    """A proportion (accuracy) measured twice on the same problems, before and after."""
    n: int
    """Problems scored both times."""
    gained: int
    """Right after, wrong before."""
    lost: int
    """Wrong after, right before."""
    change: float
    """after - before = (gained - lost) / n."""
    low: float
    high: float
    """The change's 95% interval (Newcombe's hybrid score interval for paired proportions)."""
    p_value: float
    """McNemar's exact test (two-sided) that gains and losses are equally likely."""

    def summary(self) -> str:
        return (f"{self.change:+.3f} (95% interval {self.low:+.3f} to {self.high:+.3f}; {self.gained} gained, "
                f"{self.lost} lost of {self.n}; McNemar exact p = {self.p_value:.3g})")


def paired_change(after: Sequence[bool], before: Sequence[bool], z: float = Z95) -> PairedChange:
    """The change in accuracy between two evaluations of the same problems (`after[i]`, `before[i]`: problem i
    right). The interval is Newcombe's (1998) method 10: each side's Wilson interval, combined through the
    correlation of the pairs (continuity-corrected as he gives it), inside [-1, 1] and sensible at 0 and n where
    the normal approximation is not; the p-value is McNemar's exact binomial test on the discordant pairs."""
    if len(after) != len(before):
        raise ValueError(f"paired results must cover the same problems: {len(after)} after, {len(before)} before")
    n = len(after)
    a = sum(1 for x, y in zip(after, before) if x and y)
    gained = sum(1 for x, y in zip(after, before) if x and not y)
    lost = sum(1 for x, y in zip(after, before) if y and not x)
    d = n - a - gained - lost
    if n == 0:
        return PairedChange(n=0, gained=0, lost=0, change=0.0, low=-1.0, high=1.0, p_value=1.0)
    p1, p2 = (a + gained) / n, (a + lost) / n
    l1, u1 = wilson(a + gained, n, z)
    l2, u2 = wilson(a + lost, n, z)
    margins = (a + gained) * (lost + d) * (a + lost) * (gained + d)
    cross = a * d - gained * lost
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    change = p1 - p2
    low = change - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = change + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return PairedChange(n=n, gained=gained, lost=lost, change=change, low=max(-1.0, low), high=min(1.0, high),
                        p_value=mcnemar_exact(gained, lost))


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: under no change each discordant pair is a gain with probability 1/2."""
    m = gained + lost
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, k) for k in range(min(gained, lost) + 1)) / 2**m
    return min(1.0, 2 * tail)
