"""Packed CPU weights carved from large regions, moved onto transparent huge pages once loaded.

A one-stream decode step streams every packed weight once: on a 1B model, 650 MiB in 4 KiB
pages is 166,000 pages a token, and the TLB misses among them slow the read (the projections
of one token 5-15% faster on 2 MiB pages, side by side on this project's benchmark machine).
A projection of its own would only take huge pages under the whole 2 MiB pages inside it,
which leaves out the small ones (a 1B model's K and V projections are 0.56 MiB) and the ends of
the others, so the packed weights are cut from regions that start on a 2 MiB boundary.

The repack writes them on 4 KiB pages. Once the engine is up, ``move_to_huge_pages`` moves
the written part of each region onto huge pages from a thread (``collapse_huge_pages`` in
``host_memory.py``), after the KV cache's own prefault, so that neither holds up the other or
the start-up. Faulting huge pages in during the load instead took the start-up from
2.5-2.8 s to 4.5-4.7 s on a VM whose host hands back the memory a guest frees (each fresh huge
page faults in 512 of the host's pages); the move takes about as long, off the start-up's
path. A region whose weights are freed before the move is skipped.

A region is memory of its own (``torch.empty``): the views cut from it keep it alive, and it
is freed with the last of them. Only the pages written are resident, so the tail of a region
that no weight took costs nothing but address space. The loader sizes one region for a whole
model from its file (``expect``) and ends it once the weights are placed (``seal``), so that the
next model starts a fresh one. Where the system gives no huge pages the regions stay on 4 KiB
pages.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedserve.common.host_memory import HUGE_PAGE, collapse_huge_pages

logger = logging.getLogger(__name__)

REGION_BYTES = 128 * HUGE_PAGE  # 256 MiB
ALIGN = 64  # a cache line: the kernels' loads never straddle one at a row's start


class _Written(NamedTuple):
    """A region's written part: a weak reference to its first buffer (alive as long as the
    region is used), its address and its bytes."""

    first: weakref.ref[torch.Tensor]
    address: int
    nbytes: int


class WeightArena:
    """Hands out uint8 buffers cut from aligned regions (see the module's docstring)."""

    def __init__(self, region_bytes: int = REGION_BYTES) -> None:
        self.region_bytes = region_bytes
        self._region: torch.Tensor | None = None
        self._first: weakref.ref[torch.Tensor] | None = None
        self._used = 0
        self._expected = 0
        self._filled: list[_Written] = []  # regions ended since the last seal
        self._sealed: list[_Written] = []  # the last seal's, not yet moved
        self._lock = threading.Lock()

    def expect(self, nbytes: int) -> None:
        """Ends the region in use and sizes the next one for ``nbytes`` to come: a model's
        weights in one region leave one partly used huge page, not one a region."""
        with self._lock:
            self._end_region()
            self._expected = nbytes

    def take(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``nbytes``, 64-byte aligned, never written
        before."""
        with self._lock:
            if self._region is None or self._used + nbytes > self._region.numel():
                self._end_region()
                size = max(self.region_bytes, self._expected, nbytes)
                self._region, self._used, self._expected = _aligned(size), 0, 0
            start = self._used
            self._used = -(-(start + nbytes) // ALIGN) * ALIGN
            buffer = self._region[start:start + nbytes]
            if start == 0:
                self._first = weakref.ref(buffer)
            return buffer

    def seal(self) -> None:
        """Ends the region in use: later buffers come from a new one, and the current one is
        freed with its last view. What the regions since the last seal hold waits for
        ``move_to_huge_pages`` (a later seal drops what an earlier one left unmoved)."""
        with self._lock:
            self._end_region()
            self._sealed, self._filled, self._expected = self._filled, [], 0

    def move_to_huge_pages(self, after: Callable[[], object] | None = None,
                           background: bool = True) -> threading.Thread | None:
        """Moves the sealed regions' written parts onto huge pages, once ``after`` (a wait)
        has returned, unless it returned False: from a daemon thread, which is returned, or
        here. None where less than a huge page was written."""
        with self._lock:
            sealed, self._sealed = self._sealed, []
        if sum(w.nbytes for w in sealed) < HUGE_PAGE:
            return None
        if not background:
            _collapse(sealed, after)
            return None
        thread = threading.Thread(target=_collapse, args=(sealed, after), daemon=True,
                                  name="pagedserve-weight-huge-pages")
        thread.start()
        return thread

    def _end_region(self) -> None:
        if self._region is not None and self._first is not None and self._used:
            self._filled.append(_Written(self._first, self._region.data_ptr(), self._used))
        self._region, self._first, self._used = None, None, 0


def _aligned(nbytes: int) -> torch.Tensor:
    """``nbytes`` starting at a 2 MiB boundary of a fresh allocation: the unaligned head is
    never written, so never resident."""
    memory = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    skip = -memory.data_ptr() % HUGE_PAGE
    return memory[skip:skip + nbytes]


def _collapse(written: list[_Written], after: Callable[[], object] | None) -> None:
    if after is not None and after() is False:
        return
    started = time.perf_counter()
    alive = [w for w in written if w.first() is not None]
    moved = all([collapse_huge_pages(w.address, w.nbytes) for w in alive])
    logger.info("packed weights (%.1f MiB) %s huge pages in %.2f s, after the start-up",
                sum(w.nbytes for w in alive) / 2**20,
                "moved onto" if moved else "not all moved onto (the kernel declined)",
                time.perf_counter() - started)


ARENA = WeightArena()
