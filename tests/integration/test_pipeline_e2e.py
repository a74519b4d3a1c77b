"""The whole pipeline through `pyflyte run` (Flyte local execution) in a fresh store: data prep -> SFT (2 real
ranks through Elastic) -> eval -> RL (real Ray, one controller actor) -> eval - `make run`'s job, with RL
shortened - raising held-out accuracy; then lineage from the RL model down to the dataset and tokenizer, one
offline wandb run per stage, and the lineage command. Marked `e2e` (a pipeline in a subprocess: Elastic forks
ranks, Ray starts threads)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 353
"""Measured wall time, idle (conftest runs the longest modules first)."""


DEFAULT_RL_STEPS = 30
"""RL steps of the acceptance run (the default recipe's 100 are bench/default_seeds.py's, over seeds, in the
README): GRPO on the default reaches held-out greedy 0.95 within 20 steps (bench/algorithms.py, seed 0), so 30
steps sit on the plateau, not on the rise, and the run takes ~4 min less."""


def test_default_recipe_rl_raises_greedy_and_sampled_accuracy_with_lineage_and_wandb_runs(tmp_path):
    """The acceptance run: `make run`'s job (the embedded tiny_cpu default, with RL shortened to 30 steps) through
    `pyflyte run` in a fresh store. SFT imitates a sloppy teacher to a plateau (greedy ~0.45: wrong on carry
    problems), and RL with the verifier must correct it, raising greedy AND sampled accuracy on the 500 held-out
    problems. Measured over seeds 0-2 with bench/default_seeds.py (README, 100 steps) on two machines: SFT greedy
    0.418-0.450, RL change +0.534 or more greedy and +0.217 or more sampled on every seed. At this run's 30
    steps greedy is on its plateau (+0.566 on this run, seed 0) but sampled accuracy is still rising - the policy
    sharpens long after its greedy answer is right: +0.070 on one machine (2026-11-28, SFT 0.434 / 0.681 -> RL
    1.000 / 0.751), above +0.08 on another - so greedy keeps the issue's bar (+0.08, far inside its spread) and
    sampled must rise by at least +0.03, under what 30 steps gave on both machines (the full +0.25 is the README
    table's). The plateau band is wide enough for another CPU's rounding but fails if SFT learned nothing or
    everything."""
    home = tmp_path / "home"
    env = {**os.environ, "POSTTRAIN_HOME": str(home)}
    out = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", "pipeline",
                          "--run_id", "e2e", "--overrides", json.dumps({"rl": {"steps": DEFAULT_RL_STEPS}})],
                         capture_output=True, text=True, timeout=1500, env=env, check=False,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    acc = {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", out.stdout)}
    print(acc)
    assert 0.30 <= acc["sft_greedy_accuracy"] <= 0.65, acc  # on the sloppy teacher's plateau
    assert acc["rl_greedy_accuracy"] >= acc["sft_greedy_accuracy"] + 0.08, acc
    assert acc["rl_sampled_accuracy"] >= acc["sft_sampled_accuracy"] + 0.03, acc  # still rising at 30 steps

    ids = dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", out.stdout))
    _assert_lineage(home, ids)
    _assert_one_wandb_run_per_stage(home, ids, out.stdout)
    _assert_prompts_selected_by_pass_rate(home, ids)


def _assert_prompts_selected_by_pass_rate(home: Path, ids: dict[str, str]) -> None:
    """The same workflow again with data.pass_rate on (RL 2 steps of 32 prompts, its own wandb off): data prep and SFT are
    cache hits (the same SFT model); the selection task samples the SFT model, and RL trains on the selected
    dataset, which the RL model names as its parent and which names the SFT model and the dataset. With
    refresh_every 1 the RL run's own workers re-measure the 128 prompts before step 2 (the curriculum), and the
    kept fraction is in the RL model's history: the selection's share at step 1."""
    from posttrain.artifacts import ArtifactStore

    over = {"rl": {"steps": 2, "prompts_per_step": 32}, "tracking": {"wandb": False},
            "data": {"pass_rate": {"enabled": True, "samples_per_prompt": 4, "max_prompts": 128, "refresh_every": 1}}}
    out = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", "pipeline",
                          "--run_id", "e2e-pass-rate", "--overrides", json.dumps(over)],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "POSTTRAIN_HOME": str(home)},
                         check=False, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "pass_rate: kept" in out.stdout, out.stdout[-3000:]
    again = dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", out.stdout))
    store = ArtifactStore(str(home))
    rl_model = store.manifest(again["rl_model_id"])
    (selected,) = [p for p in rl_model.parents if store.manifest(p).extra.get("stage") == "pass_rate"]
    assert sorted(store.manifest(selected).parents) == sorted([ids["sft_model_id"], ids["dataset_id"]])
    assert again["sft_model_id"] == ids["sft_model_id"] and ids["dataset_id"] not in rl_model.parents
    first, second = rl_model.extra["history"]
    assert first["pass_rate/kept_fraction"] == store.manifest(selected).metrics["num_train"] / 128
    assert "pass_rate/in_band_fraction" not in first and second["time/pass_rate_s"] > 0
    assert second["pass_rate/kept_fraction"] in (second["pass_rate/in_band_fraction"], first["pass_rate/kept_fraction"])
    assert re.search(r"curriculum refresh at policy version 1: \d+ of 128 prompts in the band", out.stdout), \
        out.stdout[-3000:]


def _assert_lineage(home: Path, ids: dict[str, str]) -> None:
    """The RL model names the SFT model and the dataset; the SFT model the dataset and the tokenizer; each
    evaluation its model."""
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(str(home))
    rl_model, sft_model = store.manifest(ids["rl_model_id"]), store.manifest(ids["sft_model_id"])
    assert rl_model.kind == "model" and {ids["sft_model_id"], ids["dataset_id"]} <= set(rl_model.parents)
    assert ids["dataset_id"] in sft_model.parents
    tok = [p for p in sft_model.parents if store.manifest(p).kind == "tokenizer"]
    assert len(tok) == 1
    assert ids["sft_model_id"] in store.manifest(ids["sft_eval_id"]).parents
    assert ids["rl_model_id"] in store.manifest(ids["rl_eval_id"]).parents

    # The console command shows the chain RL model -> SFT model -> dataset and tokenizer.
    lineage = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(home), "lineage",
                              ids["rl_model_id"][:12]], capture_output=True, check=False, text=True, timeout=60)
    assert lineage.returncode == 0, lineage.stderr
    for ident in (ids["rl_model_id"], ids["sft_model_id"], ids["dataset_id"], tok[0]):
        assert ident[:12] in lineage.stdout, lineage.stdout


def _assert_one_wandb_run_per_stage(home: Path, ids: dict[str, str], stdout: str) -> None:
    """One offline wandb run per stage, grouped by the run id, each naming its inputs and outputs; the summary
    says where they are and how to upload them."""
    from tests.wandb_log import read_run

    folder = home / "wandb" / "e2e" / "wandb"
    runs = [read_run(f) for f in sorted(folder.glob("offline-run-*"))]
    assert sorted(r["job_type"] for r in runs) == ["eval", "eval", "rl", "sft"] and {r["group"] for r in runs} == {"e2e"}
    by_stage = {r["job_type"]: r["config"]["posttrain"] for r in runs}
    assert by_stage["sft"]["outputs"] == {"model": ids["sft_model_id"]}
    assert by_stage["rl"]["inputs"] == {"start_model": ids["sft_model_id"], "dataset": ids["dataset_id"]}
    assert by_stage["rl"]["outputs"] == {"model": ids["rl_model_id"]}
    assert {r["config"]["posttrain"]["outputs"]["eval"] for r in runs if r["job_type"] == "eval"} == {
        ids["sft_eval_id"], ids["rl_eval_id"]}
    rl_steps = [h["_step"] for r in runs if r["job_type"] == "rl" for h in r["history"] if "reward_mean" in h]
    assert rl_steps == list(range(1, DEFAULT_RL_STEPS + 1))
    assert f"wandb:      4 offline runs (one per stage, group e2e) in {folder}" in stdout
