"""`return_free_memory` hands malloc's free pages back to the OS: a process that freed most of many small
allocations (tensors under glibc's mmap threshold, as activations and per-layer gradients are) keeps them as
resident memory until it is called."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import torch
    from posttrain.spmd.memory import free_heap_bytes, return_free_memory

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    ts = [torch.ones(16384) for _ in range(4000)]  # 4000 x 64 KiB = 250 MiB, each well under the mmap threshold
    kept = ts[::50]  # a few survivors spread over the heap: it cannot simply shrink from its top
    del ts
    free = free_heap_bytes()
    skipped = return_free_memory(at_least=free + 2**30)  # more than is free: left alone
    before = rss_mib()
    ok = return_free_memory(at_least=free // 2)
    print(ok, skipped, free // 2**20, before, rss_mib())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_free_heap_pages_go_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    ok, skipped, free, before, after = out.stdout.split()
    assert ok == "True" and skipped == "False", out
    assert int(free) > 200, f"mallinfo2 says {free} MiB free after ~245 MiB were freed"
    assert float(before) - float(after) > 100, f"RSS {before} MiB -> {after} MiB"
