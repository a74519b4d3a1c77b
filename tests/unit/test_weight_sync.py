"""Weight-sync checks: the checksum, version+checksum verification naming the stale worker, the drift check."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.rl.types import WeightReport, WeightsHandle, WorkerId
from posttrain.rl.weight_sync import (
    StaleWeightsError,
    WeightDriftError,
    drift_gate,
    verify_reports,
    weights_checksum,
)


def _w(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"b.weight": torch.randn(3, 4, generator=g), "a.bias": torch.randn(4, generator=g)}


def _id(rank, world=2):
    return WorkerId(role="rollout", rank=rank, world_size=world, node="n", pid=100 + rank)


def test_checksum_is_order_free_and_sees_one_changed_element():
    w = _w()
    assert weights_checksum(w) == weights_checksum(dict(reversed(list(w.items()))))
    changed = {k: v.clone() for k, v in w.items()}
    changed["a.bias"][2] += 1e-6
    assert weights_checksum(changed) != weights_checksum(w)
    assert weights_checksum({"x": torch.zeros(2, 3)}) != weights_checksum({"x": torch.zeros(3, 2)})  # shape counts
    assert weights_checksum({"x": torch.ones(2, dtype=torch.float64)}) == weights_checksum({"x": torch.ones(2)})


def test_verify_reports_names_the_stale_worker():
    new, old = weights_checksum(_w(1)), weights_checksum(_w(0))
    handle = WeightsHandle(version=5, checksum=new, payload=None)
    good = WeightReport(worker=_id(0), version=5, checksum=new)
    verify_reports(handle, [good, WeightReport(worker=_id(1), version=5, checksum=new)], [_id(0), _id(1)])
    stale = WeightReport(worker=_id(1), version=5, checksum=old)  # right version, previous weights
    with pytest.raises(StaleWeightsError, match=r"rollout\[1/2\] \(pid 101\) reports version 5 checksum") as e:
        verify_reports(handle, [good, stale], [_id(0), _id(1)])
    assert "rollout[0/2]" not in str(e.value)
    with pytest.raises(StaleWeightsError, match=r"reports version 4"):
        verify_reports(handle, [good, WeightReport(worker=_id(1), version=4, checksum=new)])
    with pytest.raises(StaleWeightsError, match=r"rollout\[1/2\] \(pid 101\) sent no weight report"):
        verify_reports(handle, [good], [_id(0), _id(1)])


def test_drift_gate_fails_above_the_threshold_and_on_nan():
    assert drift_gate(0.01, version=3, threshold=0.05, rollout_workers=[_id(0)]) == 0.01
    with pytest.raises(WeightDriftError, match=r"policy version 3.*rollout\[0/2\]"):
        drift_gate(0.06, version=3, threshold=0.05, rollout_workers=[_id(0)])
    with pytest.raises(WeightDriftError, match=r"= nan > rl.drift_threshold"):  # NaN does not slip past `>`
        drift_gate(math.nan, version=3, threshold=0.05, rollout_workers=[_id(0)])
