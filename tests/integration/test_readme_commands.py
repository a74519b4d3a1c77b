"""The README's and the docs' commands run as written. Every command in their ```bash blocks is either run
here - in a fresh store that a short pipeline run through `pyflyte run` filled, its placeholders (ID_OR_PREFIX,
MODEL, <run id>, ...) replaced by that run's real ids and `[optional]` parts included - or listed in NOT_RUN with
the reason and the test that covers it. A README command that is in neither list fails the test, so a new one
cannot go unchecked. Marked `e2e` (a pipeline run through Flyte, Elastic and Ray in subprocesses)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 156
"""Measured wall time, idle (conftest runs the longest modules first)."""

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "readme"
OVERRIDES = {"data": {"num_examples": 2000, "eval_size": 40}, "sft": {"steps": 20, "warmup_steps": 2},
             "eval": {"num_problems": 40, "k": 1}, "rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4}}

NOT_RUN = {  # command prefix -> why it is not run here, and what covers it
    "make run": "the default recipe through pyflyte (8 min): test_pipeline_e2e.py::test_default_recipe_... runs it "
                "with RL shortened to 30 steps; bench/default_seeds.py runs it whole over 3 seeds (README)",
    "make test": "this suite itself",
    ".venv/bin/pyflyte run workflows/pipeline.py pipeline": "a full recipe run (minutes); this test and "
                                                            "test_pipeline_e2e.py run the same workflow shortened",
    ".venv/bin/pyflyte run workflows/pipeline.py sft_pipeline": "1,500 SFT steps; the workflow runs in "
                                                                "test_pipeline_e2e.py and test_decks_browser.py",
    ".venv/bin/pyflyte run workflows/pipeline.py dpo_pipeline": "SFT, pairs and DPO on the default (minutes): "
                                                                "test_dense_pipelines_e2e.py runs it shortened, "
                                                                "twice (a changed dpo.beta re-runs DPO only)",
    ".venv/bin/pyflyte run workflows/pipeline.py reward_model_pipeline": "test_dense_pipelines_e2e.py, shortened",
    ".venv/bin/pyflyte run workflows/pipeline.py rlhf_pipeline": "SFT, pairs, a reward model and 100 PPO steps "
                                                                 "(minutes): test_dense_pipelines_e2e.py runs it "
                                                                 "shortened; bench/default_seeds.py --workflow "
                                                                 "rlhf_pipeline measures it",
    ".venv/bin/pyflyte run workflows/pipeline.py distill_pipeline": "2,000 distillation steps: "
                                                                    "test_dense_pipelines_e2e.py runs it shortened",
    ".venv/bin/pyflyte run workflows/pipeline.py agent_pipeline": "2,000 SFT and 100 RL steps in the calculator "
                                                                  "environment (~15 min): "
                                                                  "test_agent_pipeline_e2e.py runs it with 1,000 SFT "
                                                                  "and 30 RL steps; bench/default_seeds.py --workflow "
                                                                  "agent_pipeline measures it over seeds",
    ".venv/bin/pyflyte run workflows/pipeline.py agent_pipeline --recipe tiny_guess_number":
        "SFT and 100 RL steps in the game (~15 min): the calculator's run above covers the workflow; the task's "
        "data and episodes are test_env_tasks.py's; bench/default_seeds.py --recipe tiny_guess_number measures it "
        "over seeds (docs/agents.md)",
    ".venv/bin/pyflyte run workflows/pipeline.py agent_pipeline --recipe small_instruct_calculator_cpu":
        "SmolLM2-135M-Instruct with LoRA, SFT and 10 RL steps in the calculator environment (under an hour here): "
        "test_agent_pipeline_e2e.py runs the workflow, test_real_model_rl.py RL from the model folder; "
        "bench/default_seeds.py --recipe small_instruct_calculator_cpu measures it (docs/agents.md)",
    ".venv/bin/wandb login": "interactive, needs a wandb account (the sync after it is run with --dry-run)",
    "make real-model": "builds SmolLM2-135M from its PyPI package (minutes, ~0.5 GB): test_real_model.py",
    "M=": "a shell variable for the next commands",
    ".venv/bin/posttrain eval --recipe small_instruct_cpu": "needs the user's /data files and the real model: "
                                                             "test_real_model.py runs this flow",
    ".venv/bin/pyflyte run workflows/pipeline.py pipeline --recipe small_instruct_cpu":
        "the user's data and the real model: test_real_model_rl.py runs RL from a model folder (examples/own_model, tiny)",
    ".venv/bin/pyflyte run workflows/retrain.py retrain": "the default recipe twice (10 min): "
                                                          "test_retrain_e2e.py runs two nights of it, shortened",
    "python3 -m venv": "refreshing the pins downloads the world from PyPI (make test installs from the lock)",
    ". /tmp/fresh/bin/activate": "refreshing the pins (as above)",
    "pip ": "refreshing the pins (as above)",
    "make install-vllm": "make test installs and tests the vLLM extra itself (its last step)",
    "make run-vllm": "the default recipe with vLLM (minutes): the vLLM RL tests in make test",
    "make test-vllm": "part of make test",
    "make lock-vllm": "re-resolves the vLLM pins from PyPI",
    ".venv/bin/python examples/cluster/launch.py --registry": "builds and pushes an image, registers with a Flyte "
                                                              "cluster and starts a run there: its --dry-run (the "
                                                              "same steps without a cluster) runs here",
}

LAUNCH_DRY_RUN = ".venv/bin/python examples/cluster/launch.py --dry-run"
"""docs/cluster.md's launch without a cluster (examples/cluster): the image's name, `pyflyte register --dry-run
--copy none` of workflows/, the run's recipe and overrides validated."""


def readme_commands() -> list[str]:
    """Every command of the bash blocks of README.md and the docs pages: comments dropped, quoted lines joined,
    `a && b` split."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        pending = ""
        for line in block.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            for m in re.finditer(r"\s#", pending):  # a comment starts at the first ` #` outside quotes
                if not pending[:m.start()].count("'") % 2:
                    pending = pending[:m.start()]
                    break
            if pending.count("'") % 2:  # inside a quoted argument that goes on
                continue
            out.extend(c.strip() for c in pending.split(" && ") if c.strip())
            pending = ""
    return out


def _covers(prefix: str, cmd: str) -> bool:
    """`prefix` names `cmd`: whole words (`make test` is not `make test-vllm`)."""
    return cmd == prefix or cmd.startswith(prefix if prefix.endswith((" ", "=")) else prefix + " ")


def _fill(cmd: str, ids: dict) -> str:
    """Placeholders -> this run's values; `[optional parts]` included."""
    for placeholder, value in (("DIR_OR_ID", ids["sft"][:12]), ("ID_OR_PREFIX", ids["rl"][:12]),
                               ("RUN_ID", RUN_ID), ("<run id>", RUN_ID), ("JSON", f"'{json.dumps(OVERRIDES)}'"),
                               ("--recipe R", "--recipe tiny_cpu"), (" MODEL ", f" {ids['rl'][:12]} ")):
        cmd = cmd.replace(placeholder, value)
    return re.sub(r"\[([^\]]*)\]", r"\1", cmd)


def _sh(cmd: str, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_every_readme_command_runs_as_written_or_is_covered_elsewhere(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 20, commands  # the parser found the blocks
    to_run = [c for c in commands if not any(_covers(p, c) for p in NOT_RUN)]
    unlisted = [c for c in to_run if not c.startswith((".venv/bin/posttrain ", ".venv/bin/wandb sync ",
                                                       LAUNCH_DRY_RUN))]
    assert LAUNCH_DRY_RUN in to_run, "docs/cluster.md no longer gives the launch script's dry run"
    assert not unlisted, f"README commands neither run here nor listed in NOT_RUN: {unlisted}"
    stale = [p for p in NOT_RUN if not any(_covers(p, c) for c in commands)]
    assert not stale, f"NOT_RUN entries that no README command starts with any more: {stale}"

    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"), "WANDB_MODE": "offline"}
    run = _sh(f".venv/bin/pyflyte run workflows/pipeline.py pipeline --run_id {RUN_ID} "
              f"--overrides '{json.dumps(OVERRIDES)}'", env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ids = dict(re.findall(r"(sft|rl)_model_id='([0-9a-f]{64})'", run.stdout))
    dataset = re.search(r"dataset_id='([0-9a-f]{64})'", run.stdout).group(1)
    assert set(ids) == {"sft", "rl"}, run.stdout[-2000:]
    # promote needs a channel that pins its eval set first - the README's `--pin DATASET` form does it
    pin = _sh(f".venv/bin/posttrain promote {ids['sft'][:12]} production --pin {dataset[:12]}", env)
    assert pin.returncode in (0, 3) and re.search(r"^(promoted|refused): ", pin.stdout, re.MULTILINE), pin.stdout + pin.stderr

    for cmd in to_run:
        filled = _fill(cmd, ids)
        if filled.startswith(".venv/bin/wandb sync "):  # nothing leaves the machine
            filled = filled.replace("wandb sync ", "wandb sync --dry-run ", 1)
        out = _sh(filled, env)
        ok = (0, 3) if " promote " in filled else (0,)  # promote: 3 is a refusal, an answer like a promotion
        assert out.returncode in ok, f"{filled}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        if " promote " in filled:
            assert re.search(r"^(promoted|refused): ", out.stdout, re.MULTILINE), out.stdout
        if "--json" in filled:  # one JSON document about this run's artifacts
            json.loads(out.stdout)
            assert ids["sft"] in out.stdout or ids["rl"] in out.stdout, out.stdout[:2000]
        if "wandb sync" in filled:
            assert "Would sync 4 run(s)" in out.stdout + out.stderr, out.stdout + out.stderr
        if filled.startswith(LAUNCH_DRY_RUN):  # every entity compiled and counted, as the page says
            said = re.search(r"\((\d+) entities\)", (ROOT / "docs" / "cluster.md").read_text()).group(1)
            assert f"Successfully registered {said} entities" in out.stdout, out.stdout[-2000:]
            assert re.search(r"^launch: image \S+/posttrain-cpu:\S+ \(not built: dry run\)$", out.stdout,
                             re.MULTILINE), out.stdout[-2000:]
            assert "launch: dry run - would start workflows.pipeline.pipeline version dry-run in " \
                   "posttrain/development with recipe 'tiny_cpu'" in out.stdout, out.stdout[-2000:]
