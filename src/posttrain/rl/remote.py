"""Waiting on role workers: every wait has a timeout and every failure names the stage and the worker.

Group classes call `w.method.remote(...)` on each worker handle and then `gather(refs, ids, stage=...)`.
The handles are Ray actor handles in a real run, or `LocalActor` wrappers around plain objects in tests and
in-process runs - the group code is the same either way.
"""

from __future__ import annotations

import traceback
from typing import Any, Sequence

from posttrain.rl.types import WorkerId


class RemoteTimeoutError(TimeoutError):
    """A stage did not answer in time; names the stage and the workers still pending."""


class RemoteWorkerError(RuntimeError):
    """A worker raised; names the stage and the worker, with the worker's traceback."""


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
    """Results of `refs` in order; raises RemoteTimeoutError / RemoteWorkerError naming stage and worker."""
    if refs and isinstance(refs[0], LocalRef):
        out = []
        for ref, w in zip(refs, workers):
            if ref.error is not None:
                raise RemoteWorkerError(f"stage {stage}: worker {w} failed: {ref.error[0]!r}\n{ref.error[1]}") \
                    from ref.error[0]
            out.append(ref.value)
        return out
    import ray

    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [str(w) for r, w in zip(refs, workers) if r in pending]
        raise RemoteTimeoutError(f"stage {stage}: no answer within {timeout_s:.0f}s from {', '.join(late)}")
    out = []
    for ref, w in zip(refs, workers):
        try:
            out.append(ray.get(ref, timeout=timeout_s))
        except ray.exceptions.RayError as e:
            raise RemoteWorkerError(f"stage {stage}: worker {w} failed: {e}") from e
    return out


def is_ref(x: Any) -> bool:
    if isinstance(x, LocalRef):
        return True
    try:
        import ray

        return isinstance(x, ray.ObjectRef)
    except ImportError:
        return False
