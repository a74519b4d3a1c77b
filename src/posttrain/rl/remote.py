"""Waiting on role workers: every wait has a timeout and every failure names the stage and the worker.

Group classes call `w.method.remote(...)` on each worker handle and then `gather(refs, ids, stage=...)`.
The handles are Ray actor handles in a real run, or `LocalActor` wrappers around plain objects in tests and
in-process runs - the group code is the same either way.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

from posttrain.rl.types import WorkerId


class RemoteTimeoutError(TimeoutError):
    """A stage did not answer in time; names the stage and the workers still pending."""


class RemoteWorkerError(RuntimeError):
    """A worker raised; names the stage and the worker, with the worker's traceback."""


class WorkerLostError(RemoteWorkerError):
    """A worker's process is gone (killed, crashed, its node lost): the run can go on only with a new one
    (`posttrain.rl.run` restarts the role actors from the last checkpoint, up to rl.max_restarts)."""


class LocalRef:
    """An already-computed result (or exception) of an in-process call."""

    def __init__(self, fn, args, kwargs):
        try:
            self.value, self.error = fn(*_resolve(args), **{k: _resolve([v])[0] for k, v in kwargs.items()}), None
        except Exception as e:  # noqa: BLE001 - re-raised by gather with stage and worker names
            self.value, self.error = None, (e, traceback.format_exc())


def _resolve(args):
    return [a.value if isinstance(a, LocalRef) else a for a in args]


class _LocalMethod:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs) -> LocalRef:
        return LocalRef(self._fn, args, kwargs)


class LocalActor:
    """Wrap a plain worker object so `handle.method.remote(...)` works in-process like a Ray actor."""

    def __init__(self, obj: Any):
        self._obj = obj

    def __getattr__(self, name: str) -> _LocalMethod:
        return _LocalMethod(getattr(self._obj, name))


def gather(refs: Sequence, workers: Sequence[WorkerId | str], *, stage: str, timeout_s: float) -> list:
    """Results of `refs` in order; raises RemoteTimeoutError / RemoteWorkerError / WorkerLostError naming stage
    and worker. Fails fast: the first worker that fails (or dies) is reported as soon as it does, not after
    the timeout - when one SPMD rank dies, the others wait in a collective that would otherwise turn a lost
    worker into a timeout naming the survivors."""
    if not refs:  # nothing to wait for (e.g. the other ranks of a one-rank group): no Ray needed
        return []
    if isinstance(refs[0], LocalRef):
        out = []
        for ref, w in zip(refs, workers):
            if ref.error is not None:
                raise RemoteWorkerError(f"stage {stage}: worker {w} failed: {ref.error[0]!r}\n{ref.error[1]}") \
                    from ref.error[0]
            out.append(ref.value)
        return out
    import ray

    names = {r: w for r, w in zip(refs, workers)}
    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            late = ", ".join(str(names[r]) for r in pending)
            raise RemoteTimeoutError(f"stage {stage}: no answer within {timeout_s:.0f}s from {late}")
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as e:
                raise WorkerLostError(f"stage {stage}: worker {names[ref]} is gone ({type(e).__name__}): {e}") from e
            except ray.exceptions.RayError as e:
                _raise_if_lost(pending, names, stage, because=f"worker {names[ref]} failed")
                raise RemoteWorkerError(f"stage {stage}: worker {names[ref]} failed: {e}") from e
    return ray.get(list(refs))


LOST_GRACE_S = 15.0
"""After one worker of a call fails, how long the others get to show that one of them died: when an SPMD rank
dies, its peers fail in their collective (e.g. gloo's "connection closed by peer") about when Ray notices the
death, and the death - not the peers' error - is the cause to report (and restart on)."""


def _raise_if_lost(pending: list, names: dict, stage: str, *, because: str) -> None:
    import ray

    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=LOST_GRACE_S) if pending else ([], [])
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as e:
            raise WorkerLostError(f"stage {stage}: worker {names[ref]} is gone ({type(e).__name__}; {because} "
                                  f"after it): {e}") from e
        except ray.exceptions.RayError:
            pass
