"""Huge pages for the CPU KV cache: advised over whole 2 MiB pages before the first write,
and, where the system lets a process ask (THP ``always`` or ``madvise``), the written pool is
backed by them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pagedserve.common.host_memory import HUGE_PAGE, advise_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_only_whole_huge_pages_are_advised():
    assert advise_huge_pages(torch.empty(3 * HUGE_PAGE // 4, dtype=torch.float32))
    assert not advise_huge_pages(torch.empty(1024))
    assert not advise_huge_pages(torch.empty(0))


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="transparent huge pages are off on this system")
def test_a_written_pool_is_backed_by_huge_pages():
    before = _anon_huge_kib()
    pool = torch.empty(16 * HUGE_PAGE // 4, dtype=torch.float32)  # 16 MiB
    assert advise_huge_pages(pool)
    pool.fill_(1.0)
    # At least half of the pool's whole huge pages (the kernel may not find free ones for all).
    assert _anon_huge_kib() - before >= 7 * HUGE_PAGE // 1024
    del pool
