"""dpo_pipeline, reward_model_pipeline, rlhf_pipeline and distill_pipeline through `pyflyte run` (Flyte local
execution, Elastic ranks), shortened, in one fresh store: what each stores, its lineage, and that a changed DPO
setting re-runs only DPO and its evaluation. Then the examples a user starts from with preference data
(examples/preference_dpo, examples/rlhf), with their own settings, in a store of their own. Marked `e2e` (Elastic
forks ranks: its own pytest process)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 351
"""Measured wall time, idle (conftest runs the longest modules first)."""

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"data": {"num_examples": 3000, "eval_size": 60}, "sft": {"steps": 300, "save_every": 0},
         "eval": {"num_problems": 60, "k": 0}, "pairs": {"max_prompts": 600},
         "dpo": {"steps": 6, "save_every": 0}, "reward_model": {"steps": 6, "warmup_steps": 1, "save_every": 0},
         "tracking": {"wandb": False}}


EXAMPLE_TINY = {"preference_dpo": {"tracking": {"wandb": False}},
                "rlhf": {"rl": {"steps": 2, "critic_warmup_steps": 1}, "tracking": {"wandb": False}}}
"""What the test changes in each example's settings: no wandb; RLHF: two PPO steps (the first trains only the
critic) instead of 20."""


def example_overrides(name: str) -> dict:
    """examples/NAME/overrides.py's settings (imported from the file, as a user's command runs it), with what
    EXAMPLE_TINY changes for NAME."""
    spec = importlib.util.spec_from_file_location(f"{name}_overrides", ROOT / "examples" / name / "overrides.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.overrides()
    for section, values in EXAMPLE_TINY[name].items():
        out[section] = {**out.get(section, {}), **values}
    return out


def pyflyte(workflow: str, overrides: dict, home: Path, recipe: str = "") -> str:
    p = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", workflow,
                        *(["--recipe", recipe] if recipe else []),
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


def test_examples_dpo_and_rlhf_train_on_the_users_own_pairs(tmp_path):
    """examples/preference_dpo (dpo_pipeline) and examples/rlhf (rlhf_pipeline) as their docstrings run them: the
    user's pairs are the data (no `pairs` stage samples any), the preference dataset is the parent of the DPO model
    and of the reward model, PPO names that reward model, and the RLHF run reuses the DPO run's data and SFT."""
    from posttrain.artifacts import ArtifactStore

    home = tmp_path / "home"
    store = ArtifactStore(str(home))
    out = pyflyte("dpo_pipeline", example_overrides("preference_dpo"), home, recipe="tiny_cpu")
    ids = dict(re.findall(r"(dataset|sft_model|rl_model)_id='([0-9a-f]{64})'", out))
    data, sft, dpo = (store.manifest(ids[k]) for k in ("dataset", "sft_model", "rl_model"))
    assert data.config["schema"] == "preference" and "40 train / 8 eval" in out  # pairs.jsonl: 48 rows, 8 held out
    assert data.id in sft.parents and dpo.stage == "dpo" and set(dpo.parents) == {sft.id, data.id}
    assert dpo.extra["frozen_model"] == sft.id and {"rewards/margin", "accuracy"} <= set(dpo.extra["history"][-1])
    assert not [m for m in store.list(kind="dataset") if m.stage == "pairs"] and "pairs:" not in out

    out = pyflyte("rlhf_pipeline", example_overrides("rlhf"), home, recipe="tiny_cpu_rlhf")
    for stage in ("data_prep", "sft"):  # the same pairs.jsonl and SFT settings as examples/preference_dpo
        assert f"{stage}: cache hit" in out, out[-3000:]
    assert re.search(r"pairwise accuracy [0-9.]+ on 8 held-out pairs", out)
    rm = store.list(kind="reward_model")[-1]
    assert rm.parents[0] == data.id and sft.id in rm.parents  # trained on the user's pairs, from the SFT model
    ppo = store.manifest(re.search(r"rl_model_id='([0-9a-f]{64})'", out).group(1))
    assert ppo.extra["algorithm"] == "ppo" and {rm.id, sft.id, data.id} <= set(ppo.parents)  # prompts: the pairs'
    assert ppo.config["reward"]["fn_weight"] == 0.0
    last = ppo.extra["history"][-1]
    assert {"reward/model0_mean", "reward/fn_accuracy", "critic/value_loss"} <= set(last)
    assert last["policy_version"] == 1  # step 1 trained only the critic
    assert not [m for m in store.list(kind="dataset") if m.stage == "pairs"] and "pairs:" not in out
