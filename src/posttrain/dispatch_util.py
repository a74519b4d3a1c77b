"""Contiguous even splits (used where order and grouping must be kept, e.g. GRPO groups across rollout
workers); token-balanced splits live in posttrain.rl.dispatch."""

from __future__ import annotations


def split_even(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous (lo, hi) ranges covering range(n), sizes differing by at most one; empty ranges dropped."""
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i + 1] > bounds[i]]
