"""Handing freed heap memory back to the system after a burst of allocations (loading a
model): glibc keeps what a process frees in its arenas, where it still counts in the resident
set. Elsewhere (another C library, another system) ``trim_heap`` does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


def trim_heap() -> bool:
    """Returns the free memory at the top and in the middle of the heap to the system; whether
    any was returned."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
