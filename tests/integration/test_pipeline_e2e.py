"""The whole pipeline through Flyte local execution at a tiny size: data prep -> SFT (2 real ranks through
Elastic) -> eval -> RL (real Ray, one controller actor) -> eval, then lineage from the RL model down to the
dataset and tokenizer. Marked `e2e`: it runs in its own pytest process (Elastic forks ranks; Ray starts
threads - the order inside this one test is fork first, then Ray)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

OVERRIDES = json.dumps({
    "data": {"num_examples": 3000, "eval_size": 100},
    "sft": {"steps": 40, "warmup_steps": 5, "save_every": 20},
    "eval": {"num_problems": 100, "k": 2},
    "rl": {"steps": 2, "prompts_per_step": 8, "samples_per_prompt": 4, "checkpoint_every": 1},
})


def test_full_pipeline_and_lineage(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "home"))
    from posttrain.artifacts import ArtifactStore
    from workflows.pipeline import pipeline

    s = pipeline(recipe="tiny_cpu", overrides=OVERRIDES, run_id="e2e")
    store = ArtifactStore(str(tmp_path / "home"))
    rl_model = store.manifest(s.rl_model_id)
    sft_model = store.manifest(s.sft_model_id)
    assert rl_model.kind == "model" and s.sft_model_id in rl_model.parents and s.dataset_id in rl_model.parents
    assert s.dataset_id in sft_model.parents
    tok = [p for p in sft_model.parents if store.manifest(p).kind == "tokenizer"]
    assert len(tok) == 1
    assert s.sft_model_id in store.manifest(s.sft_eval_id).parents
    assert s.rl_model_id in store.manifest(s.rl_eval_id).parents
    assert 0.0 <= s.rl_greedy_accuracy <= 1.0 and 0.0 <= s.sft_greedy_accuracy <= 1.0

    # The console command shows the chain RL model -> SFT model -> dataset and tokenizer.
    out = subprocess.run([sys.executable, "-m", "posttrain.artifacts.cli", "--home", str(tmp_path / "home"),
                          "lineage", s.rl_model_id[:12]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for ident in (s.rl_model_id, s.sft_model_id, s.dataset_id, tok[0]):
        assert ident[:12] in out.stdout, out.stdout
