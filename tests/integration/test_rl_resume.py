"""An RL run killed with SIGKILL after its first checkpoint resumes and finishes with exactly the updates
of an uninterrupted run: none lost, none repeated.

The run is a driver subprocess connected to the session's Ray cluster (`ray_local`), as inside a Flyte Ray
task; SIGKILL takes the driver down and Ray reaps its actors (the job is gone). Run alone:
`pytest -m ray tests/integration/test_rl_resume.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.ray

DRIVER = r"""
import json, sys
import ray
from posttrain.config import PlacementConfig, RewardConfig, RLConfig, TrackingConfig
from posttrain.rl.run import run_rl

a = json.loads(sys.argv[1])
# The job's actors (controller, policy rank 0) write to the store: they need its credentials, as every
# node of a real cluster does.
ray.init(address=a["address"], log_to_driver=False, runtime_env={"env_vars": a["env"]})
cfg = RLConfig(steps=4, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, kl_coef=0.0, checkpoint_every=2,
               remote_timeout_s=60)
res = run_rl(rl_cfg=cfg, reward_cfg=RewardConfig(), placement_cfg=PlacementConfig(policy_workers=2), max_seq_len=32,
             tracking_cfg=TrackingConfig(wandb=False), start_model_dir=a["model_dir"],
             dataset_dir=a["dataset_dir"], store_root=a["store"], run_id="resume-test", parents=a["parents"],
             state_dir=a["state_dir"], start_model_id=a["parents"][0])
print("RESULT " + json.dumps({"model": res.model.id, "steps": res.steps,
                              "versions": [m.policy_version for m in res.history],
                              "history": [m.flat() for m in res.history]}), flush=True)
"""


@pytest.mark.timeout(900)
def test_sigkill_after_first_checkpoint_then_resume(ray_local, tiny_sft_model, tmp_path, s3_server, s3_root):
    """Store and state under an s3:// root (a real S3-protocol server), and the resumed run on "another node" (its
    own HOME and TMPDIR: no local cache, index, step log or temporary file of the killed run) - it resumes from
    the root alone. (State in a local folder: test_rl_restart's and the cluster rehearsal's resumes.)"""
    from posttrain.artifacts import ArtifactStore
    from posttrain.artifacts.state import StateDir

    env = s3_server["env"]
    root = f"{s3_root}/store"
    store = ArtifactStore(root)
    model = store.put("model", "sft", tiny_sft_model["model_dir"], run_id="t", parents=[], config={})
    data = store.put("dataset", "addition", tiny_sft_model["dataset_dir"], run_id="t", parents=[], config={})
    state = StateDir(f"{root}/state/rl/resume-test")
    args = json.dumps({"address": ray_local.get_runtime_context().gcs_address, "store": str(store.root),
                       "model_dir": str(tiny_sft_model["model_dir"]), "dataset_dir": str(tiny_sft_model["dataset_dir"]),
                       "parents": [model.id, data.id], "state_dir": state.location, "env": env})
    cmd = [sys.executable, "-c", DRIVER, args]

    def node(name: str) -> dict:
        (tmp_path / name / "tmp").mkdir(parents=True, exist_ok=True)
        token = os.path.expanduser("~/.ray/auth_token")  # the session cluster's, found through the real HOME
        return {**os.environ, **env, "HOME": str(tmp_path / name), "TMPDIR": str(tmp_path / name / "tmp"),
                **({"RAY_AUTH_TOKEN_PATH": token} if os.path.exists(token) else {})}

    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=node("node-a"))
    deadline = time.time() + 300  # a slow CI machine: start-up and two steps
    while not state.exists("LATEST") and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, f"the run ended before its first checkpoint:\n{first.stdout.read()[-3000:]}"
    assert state.exists("LATEST"), "no checkpoint within 300 s"
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert state.read_text("LATEST") == "step-000002"
    saved = json.loads(state.read_text("step-000002/controller.json"))["history"]  # the killed run's steps 1-2

    _wait_released(ray_local)  # Ray reaps the dead driver's actors and placement groups
    second = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180, env=node("node-b"))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    result = json.loads(second.stdout.split("RESULT ", 1)[1])
    assert result["steps"] == 4 and result["versions"] == [1, 2, 3, 4]
    # resumed, not started over: steps 1-2 are the killed run's own (their measured timings included)
    assert len(saved) == 2 and result["history"][:2] == saved
    # each update exactly once, though step 3 may have run before the kill (the log committed with the last
    # checkpoint)
    log = state.read_text("step-000004/steps.jsonl")
    assert [json.loads(line)["step"] for line in log.splitlines()] == [1, 2, 3, 4]
    manifest = store.manifest(result["model"])
    assert manifest.extra["policy_version"] == 4 and manifest.parents == [model.id, data.id]


def _wait_released(ray, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while ray.available_resources().get("CPU", 0) < 4.0 and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 4.0, ray.available_resources()
