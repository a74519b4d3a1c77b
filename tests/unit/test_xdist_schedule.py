"""make test's `--dist loadfile` stages (tests/xdist_schedule.py): a file waits for whichever worker frees first,
never behind a long module on a worker that took it early. A real `pytest -n 2 --dist loadfile` on four files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LONG = """
import os, pathlib, time

def test_runs_until_the_other_files_have_run():
    ran = pathlib.Path(os.environ["RAN_DIR"])
    deadline = time.monotonic() + 60
    while len(list(ran.glob("*.ran"))) < 3:
        assert time.monotonic() < deadline, "a short file was held behind this test on its worker"
        time.sleep(0.05)

def test_second():
    pass
"""
SHORT = """
import os, pathlib

def test_{name}():
    pathlib.Path(os.environ["RAN_DIR"], "{name}.ran").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_short_file_runs_on_the_free_worker_while_the_long_module_runs(tmp_path):
    """The 2-test module comes first in the queue (xdist orders files by test count); with xdist's own rule its
    worker takes the first short file at once and holds it until the module ends, so the module's first test,
    which waits for all three short files, times out. Here all three run on the other worker meanwhile."""
    suite, ran = tmp_path / "suite", tmp_path / "ran"
    suite.mkdir()
    ran.mkdir()
    (suite / "test_a_long.py").write_text(LONG)
    for name in ("b", "c", "d"):
        (suite / f"test_{name}.py").write_text(SHORT.format(name=name))
    env = {**os.environ, "RAN_DIR": str(ran), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "tests.xdist_schedule",
                          "-p", "no:cacheprovider", "-q", "--rootdir", str(suite), "-c", os.devnull, str(suite)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=suite, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "5 passed" in out.stdout, out.stdout[-2000:]
    assert len({(ran / f"{name}.ran").read_text() for name in ("b", "c", "d")}) == 1  # all on the free worker
