"""Transparent huge pages for the KV cache on the CPU, and its pages made resident ahead of use.

Decode attention reads every running sequence's blocks each step, scattered over the whole
cache (a GiB or more). With 4 KiB pages nearly every block read also misses the TLB, and a
prefetch that misses the TLB may be dropped; 2 MiB pages cover the cache with a few hundred
TLB entries. Linux backs an anonymous mapping with huge pages when the system setting
(``/sys/kernel/mm/transparent_hugepage/enabled``) is ``always``, or ``madvise`` and the range
was advised with ``MADV_HUGEPAGE`` before it is first touched, which ``advise_huge_pages``
does. Elsewhere it does nothing.

``populate`` faults a tensor's pages in as writable (``MADV_POPULATE_WRITE``, Linux 5.14) without
writing to them: what is already there stays, so it may run while the tensor is in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable

import torch

MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
PAGE = 4096


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _advise_whole_huge_pages(start: int, end: int, advice: int) -> bool:
    """``advice`` over the whole 2 MiB pages in [start, end); whether the kernel took it."""
    madvise = _madvise()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    if madvise is None or end - first < HUGE_PAGE:
        return False
    return bool(madvise(first, (end - first) // HUGE_PAGE * HUGE_PAGE, advice) == 0)


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Asks for huge pages under the whole 2 MiB pages of a CPU tensor's memory, which must
    not have been written yet; whether the kernel took the advice."""
    if tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    return _advise_whole_huge_pages(start, start + tensor.numel() * tensor.element_size(),
                                    MADV_HUGEPAGE)


def collapse_huge_pages(address: int, nbytes: int) -> bool:
    """Moves the written pages under the whole 2 MiB pages of ``nbytes`` of this process's
    memory from ``address`` onto huge pages now (``MADV_COLLAPSE``, Linux 6.1; it copies
    them, and readers may go on meanwhile); whether the kernel did it for all of them. The
    contents never change, so a range freed meanwhile costs nothing but a failed call."""
    return _advise_whole_huge_pages(address, address + nbytes, MADV_COLLAPSE)


def populate(tensor: torch.Tensor) -> bool:
    """Makes a CPU tensor's pages resident and writable without changing its contents; False
    where the kernel does not do it (before Linux 5.14, or not Linux) or memory ran short."""
    madvise = _madvise()
    if madvise is None or tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    start = tensor.data_ptr()
    first = start - start % PAGE
    end = start + tensor.numel() * tensor.element_size()
    return bool(madvise(first, end - first, MADV_POPULATE_WRITE) == 0)
