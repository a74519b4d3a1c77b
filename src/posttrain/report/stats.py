"""Confidence intervals for the numbers the pages show."""

from __future__ import annotations

import math

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
