"""Run a `posttrain.stages` script in a real subprocess (world size 1) the way the stage tests do: argv is the
store root, the shared tiny fixture's model and dataset folders, and a mode; the script prints `RESULT<json>`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start(script: str, home: Path, fixture: dict, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, str(home), str(fixture["model_dir"]),
                             str(fixture["dataset_dir"]), mode], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def run(script: str, home: Path, fixture: dict, mode: str) -> tuple[dict, str]:
    """(the script's RESULT, its stdout); fails the test when the script fails."""
    proc = start(script, home, fixture, mode)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return json.loads(stdout.split("RESULT")[1]), stdout


def kill_after_first_sft_save(proc: subprocess.Popen, home: Path) -> int:
    """SIGKILL the script once SFT has committed a state save under `home` (fails if it ends first); returns
    the newest committed step (a folder a kill left mid-save has no meta.json and does not count)."""
    deadline = time.time() + 300
    while not list((home / "state" / "sft").glob("*/step-*[0-9]/meta.json")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    saved = sorted(p.parent for p in (home / "state" / "sft").glob("*/step-*[0-9]/meta.json"))
    assert saved, "the killed run's state was deleted"
    return int(saved[-1].name.split("-")[1])
