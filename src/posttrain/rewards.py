"""User reward functions, run in a separate process that is killed when a call exceeds its time limit.

A reward function is named by an import path, `module:function` (never eval'ed), with the signature
`fn(completion: str, answer: str | None, task: str | None) -> float`. `RewardSandbox` keeps one spawned
child process; each call waits at most `timeout_s`. A call that raises or times out becomes a recorded
failure (score 0 and a message) - the child is killed and restarted on a timeout - so user code can neither
crash nor hang a run. `reward_identity` is what checkpoint manifests record about the function.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import multiprocessing as mp
from dataclasses import dataclass


def load_reward_fn(path: str):
    mod, sep, fn = path.partition(":")
    if not sep:
        raise ValueError(f"reward_fn: {path!r} must look like 'module:function'")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward_fn: cannot import {path!r}: {e}") from None


def reward_identity(path: str) -> dict:
    """{"import_path", "source_sha256"} of a user function, or of the built-in verifiers when path is ""."""
    if not path:
        from posttrain.data import verifiers

        src = inspect.getsource(verifiers)
        return {"import_path": "posttrain.data.verifiers:score", "source_sha256": hashlib.sha256(src.encode()).hexdigest()}
    fn = load_reward_fn(path)
    src = inspect.getsource(inspect.getmodule(fn))
    return {"import_path": path, "source_sha256": hashlib.sha256(src.encode()).hexdigest()}


@dataclass(frozen=True)
class RewardResult:
    score: float
    failure: str | None


def _serve(conn, path: str) -> None:
    fn = load_reward_fn(path)
    while True:
        item = conn.recv()
        if item is None:
            return
        try:
            conn.send(("ok", float(fn(*item))))
        except Exception as e:  # noqa: BLE001 - reported to the parent as a failure
            conn.send(("error", f"{type(e).__name__}: {e}"))


class RewardSandbox:
    def __init__(self, path: str, timeout_s: float):
        load_reward_fn(path)  # fail fast in the parent with a clear message
        self.path, self.timeout_s = path, timeout_s
        self._ctx = mp.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.path), daemon=True)
        self._proc.start()

    def score(self, completion: str, answer: str | None, task: str | None) -> RewardResult:
        self._conn.send((completion, answer, task))
        if not self._conn.poll(self.timeout_s):
            self._proc.kill()
            self._proc.join(5)
            self._start()
            return RewardResult(0.0, f"{self.path} timed out after {self.timeout_s}s (process killed)")
        status, value = self._conn.recv()
        if status == "ok":
            return RewardResult(value, None)
        return RewardResult(0.0, f"{self.path} raised {value}")

    def close(self) -> None:
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(2)
        if self._proc.is_alive():
            self._proc.kill()
