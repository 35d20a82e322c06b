"""Packed weights cut from aligned regions: disjoint views of one region per model, each region
freed with its last view, and what a model wrote moved onto huge pages where the system
allows."""

from __future__ import annotations

import gc
import itertools
import sys
from pathlib import Path

import pytest
import torch

from pagedserve.common.host_memory import HUGE_PAGE
from pagedserve.kernels.weight_arena import ALIGN, WeightArena

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel()


def test_buffers_are_aligned_disjoint_views_of_one_region():
    arena = WeightArena(region_bytes=HUGE_PAGE)
    taken = [arena.take(n) for n in (100, 4096, 1, 70_000)]
    assert [t.numel() for t in taken] == [100, 4096, 1, 70_000]
    assert all(t.dtype is torch.uint8 and t.data_ptr() % ALIGN == 0 for t in taken)
    # One region, handed out in order, each buffer starting at the next aligned byte.
    assert len({t.untyped_storage().data_ptr() for t in taken}) == 1
    assert taken[0].data_ptr() % HUGE_PAGE == 0
    starts = [t.data_ptr() - taken[0].data_ptr() for t in taken]
    assert starts == [0, 128, 128 + 4096, 128 + 4096 + 64]
    for t in taken:
        t.fill_(7)
    assert all(int(t.sum()) == 7 * t.numel() for t in taken)


def test_a_full_region_is_left_for_a_new_one_and_a_big_buffer_gets_its_own():
    arena = WeightArena(region_bytes=HUGE_PAGE)
    first = arena.take(HUGE_PAGE - 1000)
    second = arena.take(2000)  # does not fit the rest of the first region
    big = arena.take(3 * HUGE_PAGE)
    third = arena.take(10)  # the big one's region has no room left
    storages = {t.untyped_storage().data_ptr() for t in (first, second, big, third)}
    assert len(storages) == 4
    assert big.numel() == 3 * HUGE_PAGE and big.data_ptr() % HUGE_PAGE == 0


def test_expect_sizes_one_region_for_a_model_and_seal_ends_it():
    arena = WeightArena(region_bytes=HUGE_PAGE)
    before = arena.take(64)
    arena.expect(5 * HUGE_PAGE)
    weights = [arena.take(HUGE_PAGE) for _ in range(5)]
    assert len({t.untyped_storage().data_ptr() for t in weights}) == 1
    assert weights[0].untyped_storage().data_ptr() != before.untyped_storage().data_ptr()
    spans = sorted(_span(t) for t in weights)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    arena.seal()
    after = arena.take(64)  # room was left, but the model's region is ended
    assert after.untyped_storage().data_ptr() not in {
        t.untyped_storage().data_ptr() for t in [*weights, before]}


def test_a_region_lives_as_long_as_any_view_of_it():
    arena = WeightArena(region_bytes=HUGE_PAGE)
    kept = arena.take(1000)
    kept.fill_(3)
    arena.seal()
    for _ in range(4):  # fresh regions come and go; the kept view's bytes stay
        arena.take(HUGE_PAGE // 2).fill_(9)
        arena.seal()
    assert int(kept.sum()) == 3000


@pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists()
                    or "[never]" in THP.read_text(),
                    reason="transparent huge pages are off on this system")
@pytest.mark.parametrize("background", [True, False])
def test_sealed_weights_move_onto_huge_pages(background):
    def anon_huge_kib() -> int:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
        return 0

    # The count is the process's: engines of earlier tests freed now, not while it runs.
    gc.collect()
    arena = WeightArena(region_bytes=16 * HUGE_PAGE)
    before = anon_huge_kib()
    # Small buffers, as a model's K and V projections are: none of them holds a whole huge
    # page of its own, but the region under them does.
    parts = [arena.take(HUGE_PAGE // 4 + 100) for _ in range(40)]
    for i, part in enumerate(parts):
        part.fill_(i)
    arena.seal()
    waited = []
    thread = arena.move_to_huge_pages(after=lambda: waited.append(True), background=background)
    assert (thread is not None) == background
    if thread is not None:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert waited == [True]
    # At least half of the whole huge pages written (the kernel may not find free ones for
    # all), and every byte where it was.
    assert anon_huge_kib() - before >= 4 * HUGE_PAGE // 1024
    assert all(int(part.min()) == int(part.max()) == i for i, part in enumerate(parts))


def test_a_seal_with_less_than_a_huge_page_written_moves_nothing():
    arena = WeightArena(region_bytes=16 * HUGE_PAGE)
    arena.take(HUGE_PAGE // 2).fill_(1)
    arena.seal()
    assert arena.move_to_huge_pages() is None


def test_only_the_last_seal_waits_and_freed_weights_are_skipped(caplog):
    arena = WeightArena(region_bytes=4 * HUGE_PAGE)
    arena.take(3 * HUGE_PAGE).fill_(1)  # a model whose move never came
    arena.seal()
    kept = arena.take(2 * HUGE_PAGE)
    kept.fill_(2)
    freed = arena.take(3 * HUGE_PAGE)  # a region of its own, freed before the move
    freed.fill_(3)
    arena.seal()
    del freed
    with caplog.at_level("INFO", logger="pagedserve.kernels.weight_arena"):
        arena.move_to_huge_pages(background=False)
    # Only the live region of the last seal: 4 MiB, not 4 + 6 (freed) or 6 more (earlier).
    assert "packed weights (4.0 MiB) moved onto huge pages" in caplog.text
    assert int(kept.min()) == int(kept.max()) == 2


def test_a_wait_that_returns_false_calls_the_move_off(caplog):
    arena = WeightArena(region_bytes=4 * HUGE_PAGE)
    weights = arena.take(2 * HUGE_PAGE)
    weights.fill_(5)
    arena.seal()
    with caplog.at_level("INFO", logger="pagedserve.kernels.weight_arena"):
        arena.move_to_huge_pages(after=lambda: False, background=False)
    assert "packed weights" not in caplog.text
    # The move's list went with the call: a second call has nothing to move.
    assert arena.move_to_huge_pages(background=False) is None
    assert int(weights.min()) == int(weights.max()) == 5
