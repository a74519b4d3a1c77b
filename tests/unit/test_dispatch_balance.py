"""Token-balanced dispatch: near-perfect balance on skewed lengths where a plain split is far worse; the
original order comes back on merge."""

from __future__ import annotations

import random

import pytest

from posttrain.rl.dispatch import balanced_partition, contiguous_partition, load_imbalance, merge, shard


def _lognormal(n, seed):
    rng = random.Random(seed)
    return [max(1, int(rng.lognormvariate(4, 1.0))) for _ in range(n)]


def _bimodal(n, seed):
    rng = random.Random(seed)
    return sorted([rng.randint(5, 20) if rng.random() < 0.8 else rng.randint(400, 600) for _ in range(n)])


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("make", [_lognormal, _bimodal])
def test_balance_beats_a_plain_split(k, make):
    lengths = sorted(make(256, seed=k), reverse=True)  # skewed and sorted: the plain split's worst case
    plain = load_imbalance(lengths, contiguous_partition(len(lengths), k))
    parts = balanced_partition(lengths, k)
    assert load_imbalance(lengths, parts) <= 1.05 and 1.2 < plain
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    eq = balanced_partition(lengths, k, equal_size=True)
    sizes = [len(p) for p in eq]
    assert max(sizes) - min(sizes) <= 1


def test_merge_restores_the_original_order_and_checks_lengths():
    items = [f"item{i}" for i in range(20)]
    lengths = _lognormal(20, seed=3)
    sh = shard(items, lengths, 3)
    results = [[x.upper() for x in part] for part in sh.shards]
    assert merge(sh, results) == [x.upper() for x in items]
    assert shard(items, lengths, 3).indices == sh.indices  # deterministic
    with pytest.raises(ValueError, match="rank 1"):
        merge(sh, [results[0], results[1][:-1], results[2]])
    with pytest.raises(ValueError, match="at least one"):
        balanced_partition([1, 2], 3)
    assert balanced_partition([5, 1, 3], 1) == [[0, 1, 2]]
