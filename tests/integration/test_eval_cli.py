"""`posttrain eval` on a model you already have, run as a user would (a subprocess, a fresh POSTTRAIN_HOME):
a local HF folder becomes a `model` artifact once, by content, and is evaluated on the dataset's eval split;
the printed figure is the one stored in the `eval` artifact. Then the same model by artifact id
(`model.artifact`, here through `--model ID_PREFIX`), and the clear errors for a wrong id."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")
OVERRIDES = json.dumps({"data": {"num_examples": 2000, "eval_size": 100}, "eval": {"num_problems": 20, "k": 0}})


def _posttrain(home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([POSTTRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False,
                          env={**os.environ, "POSTTRAIN_HOME": str(home), "HF_HUB_OFFLINE": "1"})


@pytest.mark.timeout(1500)  # the first user of the shared fixture trains it (a few minutes)
def test_posttrain_eval_of_a_model_folder_then_of_its_artifact_id(tmp_path, tiny_sft_model):
    from posttrain.artifacts import ArtifactStore

    home, folder = tmp_path / "fresh-home", tiny_sft_model["model_dir"]
    assert not home.exists()
    p = _posttrain(home, "eval", "--model", str(folder), "--overrides", OVERRIDES)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    eval_id = re.search(r"^eval artifact ([0-9a-f]{64})", p.stdout, re.MULTILINE).group(1)
    greedy = float(re.search(r"^eval [0-9a-f]{12} of model [0-9a-f]{12}: greedy ([0-9.]+)", p.stdout, re.MULTILINE).group(1))

    store = ArtifactStore(home)
    ev = store.manifest(eval_id)
    assert ev.kind == "eval" and ev.metrics["num_problems"] == 20
    assert greedy == pytest.approx(ev.metrics["greedy_accuracy"], abs=5e-4)  # what was printed is what is stored
    assert ev.metrics["greedy_accuracy"] > 0.3  # the fixture has learned the task: a real evaluation ran
    model_id = next(i for i in ev.parents if store.manifest(i).kind == "model")
    base = store.manifest(model_id)
    assert base.config == {"base_path": str(folder)} and base.extra == {"stage": "base"} and base.parents == []
    weights = store.get(model_id) / "model.safetensors"
    assert weights.read_bytes() == (folder / "model.safetensors").read_bytes()

    # The same model by artifact id prefix: no second copy of the folder, the same evaluation (a cache hit).
    js = _posttrain(home, "eval", "--model", model_id[:10], "--overrides", OVERRIDES, "--json")
    assert js.returncode == 0, js.stderr[-3000:]
    out = json.loads(js.stdout)
    assert out["model_id"] == model_id and out["eval_id"] == eval_id and out["metrics"] == ev.metrics
    assert [m.id for m in store.list(kind="model")] == [model_id]
    assert weights.stat().st_nlink == 2  # the artifact's file and its blob entry: stored once

    # The same folder given again is the same artifact (by content), however it is named.
    again = _posttrain(home, "eval", "--overrides", json.dumps({**json.loads(OVERRIDES), "model": {"base_path": str(folder)},
                                                                "data": {**json.loads(OVERRIDES)["data"],
                                                                         "tokenizer": {"train": False}}}), "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["model_id"] == model_id

    # Clear errors, no traceback: an unknown id, an id of something that is not a model, no model at all.
    for args, needle in [(["--model", "0" * 12], "model.artifact"), (["--model", out["dataset_id"][:12]], "not a model"),
                         ([], "--model")]:
        bad = _posttrain(home, "eval", *args, "--overrides", OVERRIDES, timeout=120)
        assert bad.returncode == 1 and needle in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]
