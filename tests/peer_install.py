"""Install a peer framework (TRL, verl) with `pip --no-deps` into a throwaway folder of the bench cache, once,
for the tests that compare our math with theirs in a subprocess; the peer is never imported into pytest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("No matching distribution", "Could not find a version", "connection", "Connection", "NewConnectionError",
           "Max retries")
"""pip's words for "the registry cannot be reached": the test skips, saying so, instead of failing."""


def install_no_deps(default_cache: str, folder: str, pins: tuple[str, ...]) -> Path:
    """`pins` installed into $POSTTRAIN_BENCH_CACHE (or `default_cache`)/`folder`, unless a complete install
    is there already; returns the folder to put on the subprocess's PYTHONPATH."""
    cache = Path(os.environ.get("POSTTRAIN_BENCH_CACHE") or default_cache).expanduser()
    target = cache / folder
    if not (target / ".complete").exists():
        r = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                            "--target", str(target), *pins], check=False, capture_output=True, text=True)
        if r.returncode:
            err = r.stderr + r.stdout
            if any(s in err for s in OFFLINE):
                pytest.skip(f"pip cannot install {' '.join(pins)}: {err.strip().splitlines()[-1]}")
            raise RuntimeError(f"pip install of {' '.join(pins)} failed:\n{err}")
        (target / ".complete").touch()
    return target
