"""`pyflyte run` with a bad setting, as a user types it: the one-line reason comes before pyflyte's boxed
traceback (which pyflyte prints for every task error and has no switch to leave out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYFLYTE = str(Path(sys.executable).parent / "pyflyte")


def test_a_bad_override_prints_its_one_line_reason_first(tmp_path):
    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([PYFLYTE, "run", "workflows/pipeline.py", "pipeline", "--overrides", '{"rl": {"steps": -1}}'],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                         check=False)
    assert out.returncode != 0
    lines = out.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if "rl.steps" in line or "Traceback" in line)
    assert lines[first] == "plan: error: rl.steps: must be >= 1", out.stdout
    assert not (tmp_path / "home").exists()  # rejected before any stage wrote to the store
    assert len(lines) < 40, out.stdout  # the traceback after it holds the workflow and plan frames only


def test_bad_data_prints_the_stage_and_its_one_line_reason_first(tmp_path):
    """A data error only data prep can find (the file's rows): `data_prep: error: ...` naming file, row and
    field comes before the traceback."""
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": 5, "completion": "3"}\n')
    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"), "TOKENIZERS_PARALLELISM": "false"}
    overrides = json.dumps({"data": {"task": "", "files": [str(bad)], "demo_error_rate": 0.0},
                            "sft": {"steps": 1, "warmup_steps": 0}})
    out = subprocess.run([PYFLYTE, "run", "workflows/pipeline.py", "pipeline", "--overrides", overrides],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                         check=False)
    assert out.returncode != 0
    lines = out.stdout.splitlines()
    error = next(i for i, line in enumerate(lines) if line.startswith("data_prep: error: "))
    box = next(i for i, line in enumerate(lines) if "Traceback" in line)
    detail = f"{bad}:line 2: field 'prompt': expected text, got int"
    assert error < box and any(detail in line for line in lines[error:box]), out.stdout[-3000:]
