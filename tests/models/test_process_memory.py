"""After loading, the heap memory the loader freed goes back to the system (glibc's
malloc_trim), so it no longer counts in the server's resident set."""

from __future__ import annotations

import ctypes
import os
import platform

import pytest

from pagedserve.common.process_memory import trim_heap

MiB = 1 << 20


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_freed_heap_memory_leaves_the_resident_set():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 KiB chunks stay in the heap (below the mmap threshold); the last one stays in use,
    # so the heap cannot simply shrink from its top.
    chunks = [libc.malloc(64 << 10) for _ in range(3200)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, 64 << 10)
    for chunk in chunks[:-1]:
        libc.free(chunk)
    before = _resident()
    assert trim_heap()
    assert before - _resident() > 100 * MiB
    libc.free(chunks[-1])


def test_the_pages_of_tensors_read_long_ago_leave_the_resident_set(tmp_path):
    import numpy as np

    from pagedserve.server.models.gguf_weights import MappedPages

    path = tmp_path / "file.bin"
    path.write_bytes(np.arange(48 * MiB // 4, dtype=np.int32).tobytes())
    mapped = np.memmap(path, mode="r", dtype=np.int32)
    parts = np.split(mapped, 12)  # 4 MiB each
    pages = MappedPages(window=2)
    before = _resident()
    sums = []
    for part in parts:
        pages.handed_out(part)
        sums.append(int(part.sum(dtype=np.int64)))  # reads every page of the part
    # At most the last two parts (and a page at each edge) stay mapped, not all twelve.
    assert _resident() - before < 10 * MiB
    # What was dropped reads back the same.
    assert int(parts[0].sum(dtype=np.int64)) == sums[0]
    assert sums[0] == sum(range(MiB))
