"""agent_pipeline through `pyflyte run` (Flyte local execution) in a fresh store: the calculator task's data ->
SFT on demonstrated episodes (2 real ranks through Elastic) -> evaluation in the environment -> RL in the
environment (real Ray: the rollout workers play multi-turn episodes against the Calculator in its sandboxed tool
process) -> evaluation in the environment. RL must teach the sloppy teacher's student to call the tool; the
episodes, the environment's identity and the lineage are in the artifacts, and a second run finds every stage
in the cache (examples/tool_env's run of the same workflow: test_tool_env_example_e2e.py). Marked `e2e` (a pipeline
in a subprocess: Elastic forks ranks, Ray starts threads)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]
WALL_S = 561
"""Measured wall time, idle (conftest runs the longest modules first)."""
RUN_TIMEOUT_S = 2700
"""The first agent_pipeline run's limit, for a hang, not a speed: alone and idle it takes ~500 s, but make test runs
it beside the other worker's e2e files, whose Ray workers and ranks share the 2 cores - 1,287 s on 2026-12-01
(clean clone of 39611b3), and past the earlier 1,500 s on 2026-12-02 (a machine ~1.5x slower that day)."""

RL_STEPS = 20
"""The recipe's 100 are bench/default_seeds.py's (docs/agents.md's table, over seeds). Seed 0 on the default: RL's
training accuracy 0.75 at step 1, 0.96 by step 33, held-out greedy 0.520 -> 1.000 after 100 steps; after 20 steps
here, 0.520 -> 1.000 greedy and 0.653 -> 0.902 sampled (2026-12-05, alone: 561 s, 600 with 30 steps)."""
SFT = {"steps": 1000, "save_every": 250}
"""A third of the recipe's 3,000 (bench/default_seeds.py's table runs those): the SFT model at 1,000 steps sits on the
same plateau (seeds 0-2: greedy 0.520, 0.560, 0.374), which is what this test needs; every run here shares it."""
CALCULATOR = "posttrain.envs.builtin:Calculator"


def _run(home: Path, overrides: dict | None = None, run_id: str = "agent") -> subprocess.CompletedProcess:
    env = {**os.environ, "POSTTRAIN_HOME": str(home)}
    out = subprocess.run([str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py",
                          "agent_pipeline", "--run_id", run_id,
                          "--overrides", json.dumps({"sft": SFT, **(overrides or {"rl": {"steps": RL_STEPS}})})],
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The first agent_pipeline run in a fresh store, shared by this module's tests (the flaky tool's run starts
    from its SFT model, cached). Two tests, not one: under make test's loadfile scheduler a worker holds one test
    ahead of the one it runs, and a one-test module made that a whole other file, left waiting behind this one."""
    home = tmp_path_factory.mktemp("agent") / "home"
    return home, _run(home)


def test_agent_pipeline_teaches_the_tiny_model_to_call_its_tool_with_lineage_and_cache(first_run):
    """SFT imitates a teacher who answers 60% of the problems whose first factor starts with 5-9 in its head
    (wrong): greedy in the environment on its plateau (0.520 on seed 0 here; the documented band 0.30-0.75).
    RL in the environment must raise held-out greedy accuracy by at least 0.15 (20 steps: the policy calls the
    tool on most of those problems) and the RL model's episodes must call the tool more often than SFT's."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.eval import EvalReport

    home, out = first_run
    acc = {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", out.stdout)}
    print(acc)
    assert 0.30 <= acc["sft_greedy_accuracy"] <= 0.75, acc
    assert acc["rl_greedy_accuracy"] >= acc["sft_greedy_accuracy"] + 0.15, acc

    ids = dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", out.stdout))
    store = ArtifactStore(str(home))
    sft_eval, rl_eval = (EvalReport.from_json((store.get(ids[k]) / "report.json").read_text())
                         for k in ("sft_eval_id", "rl_eval_id"))
    for report in (sft_eval, rl_eval):  # scored in the environment, every greedy episode kept turn by turn
        assert report.episodes["environment"] == CALCULATOR and report.episodes["tools"] == ["calculate"]
        assert report.episodes["finished"] > 0.95
        assert all(p["episode"][0][0] == "policy" for p in report.problems)
    assert rl_eval.episodes["tool_calls_mean"] > sft_eval.episodes["tool_calls_mean"] + 0.1, (
        sft_eval.episodes, rl_eval.episodes)
    called = next(p["episode"] for p in rl_eval.problems if p["correct"] and len(p["episode"]) == 3)
    assert [who for who, _ in called] == ["policy", "tool", "policy"] and called[1][1] == called[2][1]

    rl_model = store.manifest(ids["rl_model_id"])
    assert {ids["sft_model_id"], ids["dataset_id"]} <= set(rl_model.parents)
    assert set(rl_model.extra["environment"]) == {CALCULATOR}  # the environment's source sha256, in lineage
    assert ids["dataset_id"] in store.manifest(ids["sft_model_id"]).parents
    assert ids["rl_model_id"] in store.manifest(ids["rl_eval_id"]).parents

    again = _run(home)  # cached like every pipeline: the same artifacts, no stage re-run
    assert dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", again.stdout)) == ids
    for stage in ("data_prep: cache hit", "sft: cache hit", "rl: cache hit"):
        assert stage in again.stdout, again.stdout[-3000:]


def test_a_failing_tool_is_counted_by_kind_and_the_run_completes(first_run):
    """A tool that raises, hangs, exits, prints 10 MB or returns bytes that are not UTF-8 on about a fifth of its
    calls (tests/integration/flaky_env.py), from the first run's SFT model (cached): the run completes, and every
    failure is counted by kind in the RL model's step metrics; the hangs and exits replaced the tool process."""
    from posttrain.artifacts import ArtifactStore

    home, _ = first_run
    store = ArtifactStore(str(home))
    flaky = _run(home, {"rl": {"steps": 3, "prompts_per_step": 16, "environment": "flaky_env:FlakyCalculator",
                               "episode": {"python_path": [str(Path(__file__).parent)], "tool_timeout_s": 2.0,
                                           "max_turns": 3, "max_env_tokens": 16, "max_total_tokens": 64}},
                        "eval": {"num_problems": 40, "k": 1}}, run_id="flaky")
    assert "sft: cache hit" in flaky.stdout
    flaky_ids = dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", flaky.stdout))
    history = store.manifest(flaky_ids["rl_model_id"]).extra["history"]
    assert [h["step"] for h in history] == [1, 2, 3]
    failed = {kind: sum(h.get(f"env/failures/{kind}", 0) for h in history) for kind in ("raised", "timeout", "died",
                                                                                        "not_text")}
    assert all(n >= 1 for n in failed.values()), failed
    assert sum(h["env/tool_errors"] for h in history) >= sum(failed.values())
