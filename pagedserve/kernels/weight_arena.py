"""Packed CPU weights carved from large regions backed by transparent huge pages.

A one-stream decode step streams every packed weight once: on a 1B model, 650 MiB in 4 KiB
pages is 166,000 pages a token, and the TLB misses among them slow the read (one-stream
matmul time 10–20% lower with 2 MiB pages on this project's benchmark machine). A projection
of its own would only take huge pages under the whole 2 MiB pages inside it, which leaves out
the small ones (a 1B model's K and V projections are 0.56 MiB) and the ends of the others, so
the packed weights are cut from regions of ``REGION_BYTES``, advised before any byte is written
(``host_memory.advise_huge_pages``). The load also faults a few hundred pages in place of a
hundred thousand.

A region is memory of its own (``torch.empty``): the views cut from it keep it alive, and it
is freed with the last of them. Only the pages written are resident, so the tail of a region
that no weight took costs nothing but address space. The loader sizes one region for a whole
model from its file (``expect``) and ends it once the weights are placed (``seal``), so that the
next model starts a fresh one. Where the system gives no huge pages the regions are plain
memory.
"""

from __future__ import annotations

import threading

import torch

from pagedserve.common.host_memory import HUGE_PAGE, advise_huge_pages

REGION_BYTES = 128 * HUGE_PAGE  # 256 MiB
ALIGN = 64  # a cache line: the kernels' loads never straddle one at a row's start


class WeightArena:
    """Hands out uint8 buffers cut from huge-page regions (see the module's docstring)."""

    def __init__(self, region_bytes: int = REGION_BYTES) -> None:
        self.region_bytes = region_bytes
        self._region: torch.Tensor | None = None
        self._used = 0
        self._expected = 0
        self._lock = threading.Lock()

    def expect(self, nbytes: int) -> None:
        """Ends the region in use and sizes the next one for ``nbytes`` to come: a model's
        weights in one region leave one partly used huge page, not one a region."""
        with self._lock:
            self._region, self._used, self._expected = None, 0, nbytes

    def take(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``nbytes``, 64-byte aligned, never written
        before."""
        with self._lock:
            if self._region is None or self._used + nbytes > self._region.numel():
                size = max(self.region_bytes, self._expected, nbytes)
                self._region, self._used, self._expected = _advised(size), 0, 0
            start = self._used
            self._used = -(-(start + nbytes) // ALIGN) * ALIGN
            return self._region[start:start + nbytes]

    def seal(self) -> None:
        """Ends the region in use: later buffers come from a new one, and the current one
        is freed with its last view."""
        self.expect(0)


def _advised(nbytes: int) -> torch.Tensor:
    """``nbytes`` starting at a 2 MiB boundary of a fresh mapping, advised: the unaligned head
    of the allocation is never written, so never resident."""
    memory = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    skip = -memory.data_ptr() % HUGE_PAGE
    region = memory[skip:skip + nbytes]
    advise_huge_pages(region)
    return region


ARENA = WeightArena()
