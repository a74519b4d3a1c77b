"""Two nights of scheduled retraining through `pyflyte run workflows/retrain.py retrain`, in one store:

1. night 1 (kickoff 03:00): a short pipeline; the channel holds nothing, so the gate pins this run's dataset as
   the channel's eval set and promotes the model;
2. night 2: NEWER data (another data seed: another dataset) and a model trained far less; the gate evaluates
   it AND night 1's model on night 1's pinned problems with the same settings, and refuses it - visibly in the
   workflow's output and in `posttrain channels`.
Marked `e2e` (own pytest process: Elastic forks ranks, then Ray starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 118
"""Measured wall time, idle (conftest runs the longest modules first)."""

ROOT = Path(__file__).resolve().parents[2]
NIGHT = {"data": {"num_examples": 4000, "eval_size": 100}, "sft": {"steps": 600, "save_every": 0},
         "eval": {"num_problems": 100, "k": 0},
         "rl": {"steps": 2, "prompts_per_step": 8, "samples_per_prompt": 4, "checkpoint_every": 1}}


# Night 1 trains into the rise in accuracy (recipes.tiny_cpu: 400 steps ~0.2 greedy, 1,000 ~0.7), above the bar of
# 0.1; night 2's 10 steps stay near 0 - the refusal does not hang on float rounding.


def _retrain(home: Path, overrides: dict, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POSTTRAIN_HOME": str(home), "WANDB_MODE": "disabled"}
    out = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/retrain.py", "retrain",
                          "--overrides", json.dumps(overrides), "--min_accuracy", "0.1", *extra],
                         capture_output=True, text=True, timeout=900, env=env, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def test_two_nights_one_promoted_one_refused_on_the_pinned_problems(tmp_path):
    from posttrain import promotion
    from posttrain.artifacts import ArtifactStore

    home = tmp_path / "home"
    first = _retrain(home, NIGHT, "--kickoff_time", "2026-11-24T03:00:00")
    assert "promote: PROMOTED model" in first.stdout and "promoted=True" in first.stdout, first.stdout[-3000:]
    store = ArtifactStore(home)
    held = promotion.current("production", store)
    pinned = promotion.pin("production", store)["eval_dataset_id"]
    assert {m.run_id for m in store.list()} == {"nightly-20261124T030000Z"}  # the kickoff time names the run

    worse = {**NIGHT, "data": {**NIGHT["data"], "seed": 1}, "sft": {"steps": 10, "warmup_steps": 2, "save_every": 0}}
    second = _retrain(home, worse)
    assert "promote: REFUSED model" in second.stdout and "promoted=False" in second.stdout, second.stdout[-3000:]
    assert promotion.current("production", store) == held  # the better model stays

    refused, promoted = promotion.decisions("production", store)
    assert not refused["promoted"] and promoted["promoted"]
    assert refused["eval_dataset_ids"] == [pinned]  # judged on night 1's problems ...
    night2_data = {m.id for m in store.list(kind="dataset")} - {pinned}
    assert len(night2_data) == 1  # ... although night 2 prepared newer data
    assert refused["holder"]["model_id"] == held["model_id"]
    assert refused["greedy_accuracy"] < refused["holder"]["greedy_accuracy"]
    evals = [store.manifest(e) for e in refused["eval_ids"] + refused["holder"]["eval_ids"]]
    assert {e.config["dataset_id"] for e in evals} == {pinned}
    assert len({json.dumps({k: v for k, v in e.config.items() if k != "model_id"}, sort_keys=True)
                for e in evals}) == 1  # same settings for both

    channels = subprocess.run([str(Path(sys.executable).parent / "posttrain"), "--home", str(home), "channels"],
                              capture_output=True, text=True, check=True)
    lines = channels.stdout.splitlines()
    assert lines[0].startswith(f"production  model {held['model_id'][:12]}")
    assert "refused " in lines[1] and "promoted" in lines[2]
