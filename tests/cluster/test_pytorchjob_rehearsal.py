"""SFT across nodes the way the training operator runs the SFT task as a PyTorchJob: one process per pod, each
running the Flyte task (tasks/sft.py, defined with POSTTRAIN_SFT_NNODES=2) with the environment the operator
gives an elastic PyTorchJob's pods (PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, PET_RDZV_ID, PET_NNODES,
PET_NPROC_PER_NODE, PET_MAX_RESTARTS, MASTER_ADDR, MASTER_PORT), so flytekit's Elastic plugin starts torch
elastic with a c10d rendezvous - here on localhost. Both pods share the store (POSTTRAIN_HOME), as pods
share the store root.

- 2 pods x 1 process train the same model as 1 pod x 2 processes (same world size): the same artifact.
- A pod killed mid-run (its launcher and rank, SIGKILL): the job fails (its workers have restartPolicy Never),
  the other pod is cleaned up, and Flyte's retry starts two new pods, which resume from the newest saved
  state and end with the uninterrupted run's model. (A recreated pod re-joining the surviving pod's next
  rendezvous round is what restartPolicy OnFailure would do: tried here with torch 2.13, the two agents
  waited on each other's keys until the store's 60 s timeout - that path is not used by Flyte's jobs.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # no Ray: `make test` runs it beside the e2e tests
WALL_S = 130
"""Measured wall time, idle (conftest runs the longest modules first)."""
ROOT = Path(__file__).resolve().parents[2]

POD = r"""
import json, os, sys
from flytekit.exceptions.user import FlyteUserException
from posttrain.artifacts import ArtifactStore
from posttrain.config import ModelConfig, SFTConfig, TrackingConfig
from posttrain.recipes import tiny_cpu
import tasks.sft

store = ArtifactStore(os.environ["POSTTRAIN_HOME"])
args = json.loads(sys.argv[1])
base = tiny_cpu()
cfg = SFTConfig(steps=args["steps"], global_batch_size=32, micro_batch_size=16, nproc=args["nproc"], lr=3e-3,
                warmup_steps=2, save_every=args["save_every"])
try:
    ref = tasks.sft.sft(model=base.model, sft=cfg, tracking=TrackingConfig(wandb=False, log_every=1),
                        dataset=store.ref(args["dataset"]), tokenizer=store.ref(args["tokenizer"]),
                        run_id="pytorchjob-rehearsal", start_model=None)
    print("RESULT" + json.dumps({"model": ref.id if ref is not None else None}), flush=True)
except Exception as e:  # the pod whose ranks are not rank 0 has no output (flytekit: IgnoreOutputs)
    if type(e).__name__ != "IgnoreOutputs":
        raise
    print("RESULT" + json.dumps({"model": None}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store(home: Path, tiny) -> dict:
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(home)
    ds = store.put("dataset", "addition", tiny["dataset_dir"], run_id="t", parents=[], config={})
    tok = store.put("tokenizer", "tok", tiny["tokenizer_dir"], run_id="t", parents=[], config={})
    return {"dataset": ds.id, "tokenizer": tok.id}


def _pod(home: Path, inputs: dict, *, nnodes: int, nproc: int, port: int, steps: int, save_every: int,
         log: Path) -> subprocess.Popen:
    env = {**os.environ, "POSTTRAIN_HOME": str(home), "POSTTRAIN_SFT_NNODES": str(nnodes),
           "POSTTRAIN_SFT_NPROC": str(nproc), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    if nnodes > 1:  # what the training operator sets on an elastic PyTorchJob's pods
        env.update({"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"localhost:{port}",
                    "PET_RDZV_ID": "pytorchjob-rehearsal", "PET_NNODES": f"{nnodes}:{nnodes}",
                    "PET_NPROC_PER_NODE": str(nproc), "PET_MAX_RESTARTS": "2", "MASTER_ADDR": "localhost",
                    "MASTER_PORT": str(port)})
    args = json.dumps({**inputs, "steps": steps, "nproc": nproc, "save_every": save_every})
    return subprocess.Popen([sys.executable, "-c", POD, args], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _result(proc: subprocess.Popen, log: Path, timeout: float = 600) -> dict:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"pod did not finish within {timeout:.0f}s:\n{log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return json.loads(text.split("RESULT")[-1].splitlines()[0])


@pytest.mark.timeout(900)
def test_two_pods_train_the_same_model_as_one_pod_and_a_killed_pod_resumes(tiny_sft_model, tmp_path):
    steps, save_every = 8, 2
    # one pod, two processes: the reference
    one = tmp_path / "one"
    inputs = _store(one, tiny_sft_model)
    ref = _result(_pod(one, inputs, nnodes=1, nproc=2, port=0, steps=steps, save_every=save_every,
                       log=tmp_path / "one.log"), tmp_path / "one.log")["model"]
    assert ref

    # two pods, one process each, one rendezvous on localhost
    two = tmp_path / "two"
    inputs = _store(two, tiny_sft_model)
    port = _free_port()
    pods = []
    for i in range(2):  # pod 0 first: its agent hosts the rendezvous store
        pods.append(_pod(two, inputs, nnodes=2, nproc=1, port=port, steps=steps, save_every=save_every,
                         log=tmp_path / f"two-{i}.log"))
        time.sleep(2)
    results = [_result(p, tmp_path / f"two-{i}.log") for i, p in enumerate(pods)]
    models = [r["model"] for r in results if r["model"]]
    assert models == [ref], results  # one pod's rank 0 stored it; the same weights as on one pod

    # two pods again; pod 1 is killed after the first saved state. The elastic PyTorchJob's workers run with
    # restartPolicy Never (flyteplugins' pytorch.go), so the job fails and the operator cleans its pods up
    # (SIGTERM to pod 0); Flyte retries the task (tasks/settings.py TASK_RETRIES): a new job, two new pods,
    # which resume from the newest state in the shared store.
    killed = tmp_path / "killed"
    inputs = _store(killed, tiny_sft_model)
    logs = [tmp_path / f"killed-{i}.log" for i in range(4)]
    port = _free_port()
    pod0 = _pod(killed, inputs, nnodes=2, nproc=1, port=port, steps=steps, save_every=save_every, log=logs[0])
    time.sleep(2)
    pod1 = _pod(killed, inputs, nnodes=2, nproc=1, port=port, steps=steps, save_every=save_every, log=logs[1])
    deadline = time.time() + 400
    while not list((killed / "state" / "sft").glob("*/step-*[0-9]/meta.json")):
        assert pod0.poll() is None and pod1.poll() is None and time.time() < deadline, logs[0].read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(pod1.pid, signal.SIGKILL)
    pod1.wait(30)
    os.killpg(pod0.pid, signal.SIGTERM)  # the failed job's other pod is cleaned up
    try:
        pod0.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(pod0.pid, signal.SIGKILL)
        pod0.wait(30)
    saved = sorted(int(p.parent.name.split("-")[1])
                   for p in (killed / "state" / "sft").glob("*/step-*[0-9]/meta.json"))
    assert saved and saved[-1] < steps, saved  # killed mid-run, with state to resume from
    port = _free_port()
    retry = []
    for i in (2, 3):
        retry.append(_pod(killed, inputs, nnodes=2, nproc=1, port=port, steps=steps, save_every=save_every,
                          log=logs[i]))
        time.sleep(2)
    results = [_result(p, log) for p, log in zip(retry, logs[2:])]
    assert [r["model"] for r in results if r["model"]] == [ref], results
    text = logs[2].read_text() + logs[3].read_text()
    assert f"sft: resuming at step {saved[-1]} of saved state" in text, text[-3000:]
