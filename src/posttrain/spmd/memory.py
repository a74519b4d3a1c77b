"""The trimmed heap: freed memory handed back to the OS between the phases of a training rank."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache


@lru_cache(maxsize=1)
def _libc():
    """The C library, or None where it cannot be found or loaded."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library is not glibc (musl, macOS)."""
    return getattr(_libc(), "malloc_trim", None)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@lru_cache(maxsize=1)
def _mallinfo2():
    """glibc's mallinfo2 (2.33+) returning its struct, or None."""
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


def free_heap_bytes() -> int | None:
    """Bytes free inside malloc's heaps (mallinfo2's fordblks: what a trim could hand back at most), or None
    where glibc does not say."""
    info = _mallinfo2()
    return None if info is None else int(info().fordblks)


def return_free_memory(at_least: int = 0) -> bool:
    """Give the C allocator's free pages back to the OS (glibc `malloc_trim(0)`); False where there is none.

    Tensors under glibc's mmap threshold (at most 32 MB: activations, per-layer gradients, optimizer
    temporaries) come from malloc's heaps, and freed ones stay there as RSS that only this process can reuse.
    A policy rank calls it after each update: on SmolLM2-135M it then rests at 1.86 GiB between updates
    instead of 2.3-2.7 (bench/rl_memory.py), memory the rollout can use while the policy waits.

    `at_least` > 0: only when malloc's heaps hold that many free bytes (`free_heap_bytes`). A trim hands the
    pages back and the next allocations fault them in again: after each of the embedded default's micro-batches
    (~60 MiB freed) that made its policy update x1.38 slower, so there it is skipped. Where glibc cannot say, it
    trims."""
    trim = _malloc_trim()
    if trim is None:
        return False
    free = free_heap_bytes() if at_least > 0 else None
    if free is not None and free < at_least:
        return False
    trim(0)
    return True
