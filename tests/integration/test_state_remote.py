"""Resumable SFT state under a remote store root (an `s3://` URL on a real S3-protocol server), resumed on
"another node": a fresh process with its own HOME and TMPDIR, so nothing the killed attempt kept locally
(~/.cache's index, downloaded objects, work folder, temporary files) is there - only what is under the
store's root.

The resumed run must start from the newest committed step (not from scratch), end with the same model an
uninterrupted run makes (same artifact id: ids are content + parents), and delete its remote state."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from pathlib import Path
from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import ModelConfig, SFTConfig, TrackingConfig
home, base, ds, steps = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
store = ArtifactStore(home)
data = store.put("dataset", "addition", ds, run_id="t", parents=[], config={})
cfg = SFTConfig(steps=steps, global_batch_size=16, micro_batch_size=16, nproc=1, warmup_steps=0, save_every=1)
ref = stages.sft(ModelConfig(base_path=str(base)), cfg, TrackingConfig(wandb=False, log_every=1),
                 dataset=data, tokenizer=None, run_id="t", store=store)
print("RESULT" + json.dumps({"model": ref.id}))
"""
STEPS = 20
"""Each step saves to the store: the kill, 1 s after the first commit, lands a few steps in (60 steps took 100 s)."""


def _start(home: str, node: Path, fixture: dict, env: dict) -> subprocess.Popen:
    (node / "tmp").mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, home, str(fixture["model_dir"]), str(fixture["dataset_dir"]),
                             str(STEPS)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env, "HOME": str(node), "TMPDIR": str(node / "tmp"),
                                 "HF_HUB_OFFLINE": "1"})


def _finish(proc: subprocess.Popen) -> tuple[dict, str]:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return json.loads(stdout.split("RESULT")[1]), stdout


def _committed(fs, home: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(fs.glob(f"{home}/state/sft/*/step-*/meta.json"))


@pytest.mark.timeout(1500)
def test_sft_killed_resumes_from_an_s3_store_on_another_node(tmp_path, tiny_sft_model, s3_server, s3_root):
    import fsspec

    fs = fsspec.filesystem("s3")
    home = f"{s3_root}/home"
    first = _start(home, tmp_path / "node-a", tiny_sft_model, s3_server["env"])
    deadline = time.time() + 300
    while len(_committed(fs, home)) == 0:
        assert first.poll() is None and time.time() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.1)
    time.sleep(1.0)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    committed = _committed(fs, home)
    assert committed, "the killed run's committed state is gone"
    last = int(re.search(r"step-(\d+)/meta.json$", committed[-1]).group(1))
    assert 1 <= last < STEPS

    out, stdout = _finish(_start(home, tmp_path / "node-b", tiny_sft_model, s3_server["env"]))
    folder = committed[-1].rsplit("/", 1)[0]
    assert f"sft: resuming at step {last} of saved state s3://{folder}\n" in stdout, stdout[-3000:]
    assert int(re.search(r"^step (\d+):", stdout, re.MULTILINE).group(1)) == last  # no step before it is redone
    fs.invalidate_cache()
    assert fs.glob(f"{home}/state/sft/*/*") == []  # deleted once the model was stored

    # The same training, uninterrupted, into a local store: the same model, byte for byte.
    local, _ = _finish(_start(str(tmp_path / "local-home"), tmp_path / "node-c", tiny_sft_model, {}))
    assert out["model"] == local["model"]
