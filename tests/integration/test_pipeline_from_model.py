"""RL straight from a model folder: Flyte local execution of `pipeline` with sft.enabled=false and
model.base_path set. The folder becomes a `model` artifact (by content), is evaluated, RL (real Ray) starts from
it, and lineage runs from the RL model down to it; RL's resumable state is gone once the model is stored.
Marked `ray`: it runs in the pytest process for Ray tests (no SFT ranks are forked: the workflow skips SFT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1800)]


def test_pipeline_without_sft_runs_rl_from_the_base_folder_and_lineage_reaches_it(tmp_path, monkeypatch, ray_local,
                                                                                    tiny_sft_model, capfd):
    # ray_local first: the Flyte Ray task's pre_execute reuses the session's Ray (ignore_reinit_error) - if it
    # started one itself, it would be sized to this machine's cores and stay up for the later Ray tests, which
    # are written for ray_local's 4 logical CPUs.
    home = tmp_path / "home"
    monkeypatch.setenv("POSTTRAIN_HOME", str(home))
    from posttrain.artifacts import ArtifactStore
    from workflows.pipeline import pipeline

    folder = tiny_sft_model["model_dir"]
    overrides = json.dumps({
        "model": {"base_path": str(folder)},
        "sft": {"enabled": False},
        "data": {"num_examples": 2000, "eval_size": 100, "tokenizer": {"train": False}},
        "eval": {"num_problems": 20, "k": 0},
        "rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4, "checkpoint_every": 0},
    })
    s = pipeline(recipe="tiny_cpu", overrides=overrides, run_id="from-base")
    printed = capfd.readouterr().out
    assert f"start model {s.sft_model_id[:12]}" in printed and "SFT model" not in printed  # the summary's label
    store = ArtifactStore(str(home))
    base = store.manifest(s.sft_model_id)  # SFT skipped: the model evaluated first is the base folder's artifact
    assert base.kind == "model" and base.extra == {"stage": "base"} and base.config == {"base_path": str(folder)}
    assert (store.get(base.id) / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    rl_model = store.manifest(s.rl_model_id)
    assert rl_model.id != base.id and base.id in rl_model.parents and s.dataset_id in rl_model.parents
    assert [m.id for m in store.list(kind="model") if m.extra.get("stage") == "sft"] == []  # no SFT ran
    assert base.id in store.manifest(s.sft_eval_id).parents and s.rl_model_id in store.manifest(s.rl_eval_id).parents
    assert not list((home / "state" / "rl").glob("*/step-*"))  # RL state deleted after the final model was stored

    out = subprocess.run([str(Path(sys.executable).parent / "posttrain"), "--home", str(home), "lineage",
                          s.rl_model_id[:12]], capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert base.id[:12] in out.stdout and f"base-{folder.name}" in out.stdout and s.dataset_id[:12] in out.stdout

    # The same folder in a later run is the same artifact, and costs no second copy.
    from posttrain import stages
    from posttrain.config import ModelConfig

    links = {f.name: f.stat().st_nlink for f in store.get(base.id).iterdir()}
    again = stages.start_model(ModelConfig(base_path=str(folder)), run_id="later", store=store)
    assert again.id == base.id and {f.name: f.stat().st_nlink for f in store.get(base.id).iterdir()} == links
    assert len(list((home / "objects").iterdir())) == len(store.list())
