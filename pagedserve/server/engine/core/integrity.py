"""Consistency checks of the scheduler's queues and statuses and of the block pools, in one
place and through public state only (tests call them after every operation)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from pagedserve.server.engine.core.block_manager import BlockManager
    from pagedserve.server.engine.core.block_pool import BlockPool
    from pagedserve.server.engine.core.scheduler import Scheduler

RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED
WAITING = SequenceStatus.WAITING


def check_scheduler_integrity(scheduler: Scheduler) -> None:
    """Raise AssertionError unless the queues, statuses and block pools agree."""
    queues = (scheduler.waiting, scheduler.running, scheduler.swapped)
    device_seqs = _live_seqs(scheduler.running, RUNNING)
    cpu_seqs = _live_seqs(scheduler.swapped, SWAPPED)
    if any(seq.block_table for seq in _live_seqs(scheduler.waiting, WAITING)):
        raise AssertionError("a waiting sequence holds blocks")
    queued = [group for queue in queues for group in queue]
    if sorted(g.request_id for g in queued) != sorted(scheduler.live_request_ids()):
        raise AssertionError("the queues and the live requests disagree")
    for queue in queues:
        orders = [scheduler.arrival_index(group.request_id) for group in queue]
        if orders != sorted(orders):
            raise AssertionError("a queue is out of arrival order")
    if scheduler.num_running_seqs() > scheduler.config.max_num_seqs:
        raise AssertionError("more running sequences than max_num_seqs")
    check_block_integrity(scheduler.block_manager, device_seqs, cpu_seqs)


def _live_seqs(queue: list[SequenceGroup], status: SequenceStatus) -> list[Sequence]:
    seqs = []
    for seq_group in queue:
        for seq in seq_group.get_unfinished_seqs():
            if seq.status is not status:
                raise AssertionError(
                    f"sequence {seq.seq_id} is {seq.status.name} in a {status.name} queue")
            seqs.append(seq)
    return seqs


def check_block_integrity(manager: BlockManager, device_seqs: Iterable[Sequence],
                          cpu_seqs: Iterable[Sequence] = ()) -> None:
    """Raise AssertionError unless the pools agree exactly with these live block tables.

    ``device_seqs`` must be every sequence holding device blocks and ``cpu_seqs`` every
    one holding CPU blocks: then each ref count equals its block-table references, no
    block is both free and referenced, and the free and cache counts add up.
    """
    for pool, seqs in ((manager.device_pool, list(device_seqs)),
                       (manager.cpu_pool, list(cpu_seqs))):
        for seq in seqs:
            _check_seq(seq, manager.block_size)
        _check_pool(pool, Counter(b for seq in seqs for b in seq.block_table))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def _check_seq(seq: Sequence, block_size: int) -> None:
    table = seq.block_table
    _require(len(set(table)) == len(table), f"sequence {seq.seq_id} repeats a block: {table}")
    _require(0 <= seq.num_computed_tokens <= seq.num_tokens,
             f"sequence {seq.seq_id} computed {seq.num_computed_tokens} of {seq.num_tokens}")
    _require(seq.num_computed_tokens <= len(table) * block_size,
             f"sequence {seq.seq_id} computed {seq.num_computed_tokens} tokens into "
             f"{len(table)} blocks")


def _check_pool(pool: BlockPool, refs: Counter[int]) -> None:
    unknown = sorted(b for b in refs if not (isinstance(b, int) and 0 <= b < pool.num_blocks))
    _require(not unknown, f"{pool.name} block tables hold unknown ids {unknown}")
    unused = sorted(b for b in refs if b >= len(pool.blocks))
    _require(not unused, f"{pool.name} block tables hold ids never allocated {unused}")
    for block in pool.blocks:
        expected = refs.get(block.block_id, 0)
        _require(block.ref_cnt == expected, f"{pool.name} block {block.block_id} has ref_cnt "
                 f"{block.ref_cnt}, block tables reference it {expected} times")
        _require(block.in_free_queue == (expected == 0), f"{pool.name} block {block.block_id} "
                 f"in_free_queue={block.in_free_queue} with {expected} references")
        if block.block_hash is not None:
            _require(pool.cached_blocks.get(block.block_hash) is block,
                     f"{pool.name} block {block.block_id} has a hash the cache maps elsewhere")
    queue = list(pool.free_queue)
    freed = len(pool.blocks) - len(refs)
    _require(len(queue) == len(pool.free_queue) == freed,
             f"{pool.name} free queue holds {len(queue)} blocks, counts {len(pool.free_queue)}, "
             f"{freed} of the blocks used so far are unreferenced")
    cached = [block for block in pool.blocks if block.block_hash is not None]
    _require(len(cached) == len(pool.cached_blocks),
             f"{pool.name} cache maps {len(pool.cached_blocks)} hashes, {len(cached)} blocks")
    cached_free = sum(1 for block in queue if block.block_hash is not None)
    _require(cached_free == pool.num_cached_free_blocks,
             f"{pool.name} counts {pool.num_cached_free_blocks} cached free blocks, "
             f"the free queue holds {cached_free}")
    first_cached = next((i for i, b in enumerate(queue) if b.block_hash is not None), len(queue))
    _require(all(b.block_hash is not None for b in queue[first_cached:]),
             f"{pool.name} free queue puts an uncached block behind a cached one")
