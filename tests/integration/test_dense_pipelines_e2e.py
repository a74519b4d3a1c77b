"""dpo_pipeline, reward_model_pipeline and distill_pipeline through `pyflyte run` (Flyte local execution, Elastic
ranks), shortened, in one fresh store: what each stores, its lineage, and that a changed DPO setting re-runs only
DPO and its evaluation. Marked `e2e` (Elastic forks ranks: its own pytest process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 273
"""Measured wall time, idle (conftest runs the longest modules first)."""

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"data": {"num_examples": 3000, "eval_size": 60}, "sft": {"steps": 300, "save_every": 0},
         "eval": {"num_problems": 60, "k": 0}, "pairs": {"max_prompts": 600},
         "dpo": {"steps": 6, "save_every": 0}, "reward_model": {"steps": 6, "warmup_steps": 1, "save_every": 0},
         "tracking": {"wandb": False}}


def pyflyte(workflow: str, overrides: dict, home: Path) -> str:
    p = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", workflow,
                        "--run_id", workflow, "--overrides", json.dumps(overrides)], cwd=ROOT, capture_output=True,
                       check=False, text=True, timeout=1200, env={**os.environ, "POSTTRAIN_HOME": str(home)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_dense_pipelines_store_their_models_with_lineage_and_cache_by_stage(tmp_path):
    from posttrain.artifacts import ArtifactStore

    home = tmp_path / "home"
    out = pyflyte("dpo_pipeline", {**SHORT, "tracking": {"wandb": True}}, home)
    store = ArtifactStore(str(home))
    ids = dict(re.findall(r"(sft|rl)_model_id='([0-9a-f]{64})'", out))
    dpo, sft = store.manifest(ids["rl"]), store.manifest(ids["sft"])
    assert dpo.stage == "dpo" and sft.stage == "sft" and "DPO change" in out
    pairs = store.manifest(next(p for p in dpo.parents if p != sft.id))
    dataset = re.search(r"dataset_id='([0-9a-f]{64})'", out).group(1)
    assert pairs.stage == "pairs" and set(pairs.parents) == {sft.id, dataset}  # the model sampled, the prompts
    assert pairs.metrics["num_train"] > 0 and dpo.extra["frozen_model"] == sft.id  # the reference: the start model
    assert {"rewards/margin", "accuracy"} <= set(dpo.extra["history"][-1])

    # the DPO stage is a wandb run of its own, naming its inputs (pairs, start model = reference) and output
    from tests.wandb_log import read_run

    runs = [read_run(f) for f in sorted((home / "wandb" / "dpo_pipeline" / "wandb").glob("offline-run-*"))]
    assert sorted(r["job_type"] for r in runs) == ["dpo", "eval", "eval", "sft"]
    run = next(r for r in runs if r["job_type"] == "dpo")["config"]["posttrain"]
    assert run["inputs"]["dataset"] == pairs.id and run["inputs"]["reference"] == sft.id
    assert run["outputs"] == {"model": dpo.id}

    # a DPO setting re-runs DPO and its evaluation only: data, SFT, its eval and the pairs are cache hits
    again = pyflyte("dpo_pipeline", {**SHORT, "dpo": {**SHORT["dpo"], "beta": 0.3}}, home)
    for stage in ("data_prep", "sft", "pairs"):
        assert f"{stage}: cache hit" in again, again[-3000:]
    assert "dpo: cache hit" not in again and "dpo: state in" in again

    out = pyflyte("reward_model_pipeline", SHORT, home)
    assert "pairs: cache hit" in out
    acc = float(re.search(r"pairwise accuracy ([0-9.]+) on (\d+) held-out pairs", out).group(1))
    assert 0 <= acc <= 1
    rm = store.list(kind="reward_model")[-1]
    assert rm.parents[0] == pairs.id and sft.id in rm.parents
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(str(store.get(rm.id))).config.num_labels == 1

    # rlhf_pipeline: the same SFT, pairs and reward model (cache hits), then PPO with that model as the only
    # reward; the RL model names it as a parent and logs the critic's and the verifier's numbers
    rlhf = {**SHORT, "rl": {"steps": 2, "prompts_per_step": 8, "samples_per_prompt": 4, "critic_warmup_steps": 1,
                            "checkpoint_every": 0}}
    out = pyflyte("rlhf_pipeline", rlhf, home)
    for stage in ("sft", "pairs", "reward_model"):
        assert f"{stage}: cache hit" in out, out[-3000:]
    ppo = store.manifest(dict(re.findall(r"(rl)_model_id='([0-9a-f]{64})'", out))["rl"])
    assert ppo.extra["algorithm"] == "ppo" and rm.id in ppo.parents and sft.id in ppo.parents
    assert ppo.config["reward"]["fn_weight"] == 0.0
    last = ppo.extra["history"][-1]
    assert {"critic/value_loss", "critic/vf_explained_var", "reward/fn_accuracy", "reward/model0_mean"} <= set(last)
    assert last["policy_version"] == 1  # step 1 trained only the critic
    assert "RL change" in out

    kd = {**SHORT, "distill": {"teacher": ids["sft"][:12], "steps": 20, "warmup_steps": 2, "save_every": 0}}
    out = pyflyte("distill_pipeline", kd, home)
    student = store.manifest(dict(re.findall(r"(sft)_model_id='([0-9a-f]{64})'", out))["sft"])
    assert student.stage == "distill" and student.extra["frozen_model"] == sft.id and sft.id in student.parents
    assert "student" in out
