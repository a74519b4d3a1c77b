"""SPMD ranks for tests, forked from a warm process: what torchrun does for a script, without paying the
imports again for every rank.

A rank started by torchrun is a fresh interpreter that imports torch, transformers and torch.distributed's
checkpointing before its first step - about 6 CPU-seconds, where the tests' tiny models train in a fraction
of one - so a 1x4-vs-2x2 comparison spent most of its minute importing. `run_ranks` instead forks each rank
from multiprocessing's forkserver, which imported those modules once per pytest process (`PRELOAD`); every
rank gets the environment torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), its own stdout and stderr, the script as `__main__`, and joins a real gloo group as under
torchrun. Like torchrun, the first rank that fails stops the others; a run past its timeout is killed and the
error names the ranks still running.

torchrun itself still starts the runs that are killed mid-step (the SIGKILL resume tests, found by command
line) and, as Flyte's Elastic, every `pyflyte run` of the e2e stage.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import runpy
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ["torch", "torch.distributed.checkpoint.state_dict", "transformers", "safetensors.torch",
           "posttrain.models.io", "posttrain.sft.trainer"]
"""Imported once by the forkserver, inherited by every rank it forks."""


@dataclass(frozen=True)
class Ranks:
    """What the ranks printed (rank 0's output first), like a finished torchrun's."""
    returncode: int
    stdout: str
    stderr: str


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(script: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """One rank, in the forked process: torchrun's environment, its own output files, the script as __main__."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    import torch

    if env.get("OMP_NUM_THREADS"):  # torch read it when the forkserver imported it; the rank's own value wins
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")


def run_ranks(nproc: int, script: str | Path, *args, timeout: float = 240, env: dict[str, str] | None = None,
              cwd: Path = ROOT) -> Ranks:
    """Run `script args...` as `nproc` ranks of one group (as `torchrun --standalone --nproc-per-node nproc`);
    returns when all have exited, or as soon as one fails (the others are killed)."""
    ctx = _context()
    base = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **(env or {}),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc)}
    with tempfile.TemporaryDirectory(prefix="ranks-") as logs:
        files = [(os.path.join(logs, f"{r}.out"), os.path.join(logs, f"{r}.err")) for r in range(nproc)]
        procs = [ctx.Process(target=_rank, name=f"rank {r}", daemon=True,
                             args=(str(script), [str(a) for a in args],
                                   {**base, "RANK": str(r), "LOCAL_RANK": str(r)}, str(cwd), *files[r]))
                 for r in range(nproc)]
        for p in procs:
            p.start()
        deadline, failed = time.monotonic() + timeout, None
        running = list(procs)
        while running and failed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for sentinel in wait([p.sentinel for p in running], timeout=left):
                p = next(p for p in running if p.sentinel == sentinel)
                p.join()
                running.remove(p)
                if p.exitcode != 0 and failed is None:
                    failed = p
        late = [p.name for p in running]
        for p in running:
            p.kill()
            p.join(10)
        out = "".join(Path(o).read_text(errors="replace") for o, _ in files)
        err = "".join(Path(e).read_text(errors="replace") for _, e in files)
    if failed is None and late:
        raise AssertionError(f"{script}: {', '.join(late)} still running after {timeout:.0f} s (killed)\n"
                             + err[-4000:])
    if failed is not None:
        err += f"\n{failed.name} exited with {failed.exitcode}; killed: {', '.join(late) or 'none'}\n"
    return Ranks(returncode=0 if failed is None else (failed.exitcode or 1), stdout=out, stderr=err)
