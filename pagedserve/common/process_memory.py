"""What a loader gives back of the process's memory once it is done with it: the heap memory
it freed (glibc keeps freed chunks in its arenas, where they still count in the resident set),
and the pages of a read-only file map it has read (they count too while mapped; the page
cache keeps them, so a later read finds them without disk I/O). On another C library or
system each call does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
from typing import Any

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


def trim_heap() -> bool:
    """Returns the free memory at the top and in the middle of the heap to the system; whether
    any was returned."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def drop_mapped_pages(address: int, length: int) -> bool:
    """Unmaps from this process the whole pages of ``[address, address + length)`` of a
    read-only file map (``MADV_DONTNEED``): they leave the resident set, and a later read maps
    them again from the page cache. Never use it on memory the process wrote."""
    libc = _libc()
    first = -(-address // PAGE) * PAGE
    end = (address + length) // PAGE * PAGE
    if libc is None or end <= first:
        return False
    return bool(libc.madvise(first, end - first, MADV_DONTNEED) == 0)
