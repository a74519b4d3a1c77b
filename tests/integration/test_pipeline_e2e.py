"""The whole pipeline through Flyte local execution at a tiny size: data prep -> SFT (2 real ranks through
Elastic) -> eval -> RL (real Ray, one controller actor) -> eval, then lineage from the RL model down to the
dataset and tokenizer; and the default recipe (`make run`'s job, in a subprocess) raising held-out accuracy.
Marked `e2e`: it runs in its own pytest process (Elastic forks ranks; Ray starts threads - the order inside
the in-process test is fork first, then Ray)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

OVERRIDES = json.dumps({
    "data": {"num_examples": 3000, "eval_size": 100},
    "sft": {"steps": 40, "warmup_steps": 5, "save_every": 20},
    "eval": {"num_problems": 100, "k": 2},
    "rl": {"steps": 2, "prompts_per_step": 8, "samples_per_prompt": 4, "checkpoint_every": 1},
})


def test_full_pipeline_and_lineage(tmp_path, monkeypatch, capfd):
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

    # One offline wandb run per stage, grouped by the run id, each naming its inputs and outputs; the summary
    # says where they are and how to upload them.
    from tests.wandb_log import read_run

    folder = tmp_path / "home" / "wandb" / "e2e" / "wandb"
    runs = [read_run(f) for f in sorted(folder.glob("offline-run-*"))]
    assert sorted(r["job_type"] for r in runs) == ["eval", "eval", "rl", "sft"] and {r["group"] for r in runs} == {"e2e"}
    by_stage = {r["job_type"]: r["config"]["posttrain"] for r in runs}
    assert by_stage["sft"]["outputs"] == {"model": s.sft_model_id}
    assert by_stage["rl"]["inputs"] == {"start_model": s.sft_model_id, "dataset": s.dataset_id}
    assert by_stage["rl"]["outputs"] == {"model": s.rl_model_id}
    assert {r["config"]["posttrain"]["outputs"]["eval"] for r in runs if r["job_type"] == "eval"} == {s.sft_eval_id,
                                                                                                     s.rl_eval_id}
    rl_steps = [h["_step"] for r in runs if r["job_type"] == "rl" for h in r["history"] if "reward_mean" in h]
    assert rl_steps == [1, 2]
    assert f"wandb:      4 offline runs (one per stage, group e2e) in {folder}" in capfd.readouterr().out

    # The console command shows the chain RL model -> SFT model -> dataset and tokenizer.
    out = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(tmp_path / "home"),
                          "lineage", s.rl_model_id[:12]], capture_output=True, check=False, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for ident in (s.rl_model_id, s.sft_model_id, s.dataset_id, tok[0]):
        assert ident[:12] in out.stdout, out.stdout


def test_default_recipe_rl_raises_greedy_and_sampled_accuracy(tmp_path):
    """The acceptance run: `make run`'s job (the embedded tiny_cpu default, no overrides) through `pyflyte run`
    in a fresh store. SFT imitates a sloppy teacher to a plateau (greedy ~0.45: wrong on carry problems), and
    RL with the verifier must correct it, raising greedy AND sampled accuracy on the 500 held-out problems.
    Measured over seeds 0-2 with bench/default_seeds.py (README): SFT greedy 0.418-0.450, RL change +0.534 or
    more greedy and +0.217 or more sampled on every seed (std 0.024 / 0.031); the bars below are the issue's
    (+0.08), far inside that spread, and the plateau band is wide enough for another CPU's rounding but fails
    if SFT learned nothing or everything."""
    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"), "WANDB_MODE": "disabled"}
    out = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", "pipeline"],
                         capture_output=True, text=True, timeout=1500, env=env, check=False,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    acc = {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", out.stdout)}
    print(acc)
    assert 0.30 <= acc["sft_greedy_accuracy"] <= 0.65, acc  # on the sloppy teacher's plateau
    assert acc["rl_greedy_accuracy"] >= acc["sft_greedy_accuracy"] + 0.08, acc
    assert acc["rl_sampled_accuracy"] >= acc["sft_sampled_accuracy"] + 0.08, acc
