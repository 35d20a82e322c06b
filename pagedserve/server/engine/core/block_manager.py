"""Block tables on top of the device pool and the CPU swap pool.

Sequences own their block tables; the block manager fills them, keeps the pools' ref counts
equal to the number of block-table references, and returns the block copies the model runner
must do before the next step. A sequence's table points into the CPU pool while it is
``SWAPPED`` and into the device pool otherwise.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable

from pagedserve.common.engine_errors import BlockAllocationError
from pagedserve.server.engine.config.engine_config import CacheConfig
from pagedserve.server.engine.core.block_pool import BlockPool
from pagedserve.server.engine.core.integrity import check_block_integrity
from pagedserve.server.engine.core.kv_allocation import (
    KVAllocationPolicy,
    PagedAllocation,
    cdiv,
    make_kv_allocation,
)
from pagedserve.server.engine.core.kv_usage import KVCacheUsage, PoolUsage
from pagedserve.server.engine.core.prefix_cache import (
    BlockHash,
    PrefixCacheStats,
    max_cache_hit_blocks,
    new_block_hashes,
)
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

BlockMapping = list[tuple[int, int]]


class AllocStatus(enum.Enum):
    OK = "ok"  # the request's blocks fit now, above the watermark
    LATER = "later"  # they will fit once running requests free blocks
    NEVER = "never"  # they exceed the whole pool (less the watermark)


class BlockManager:
    """Allocation, sharing (copy-on-write), prefix-cache hits and swapping of block tables."""

    def __init__(
        self,
        block_size: int,
        num_device_blocks: int,
        num_cpu_blocks: int,
        *,
        policy: KVAllocationPolicy | None = None,
        watermark: float = 0.01,
        enable_prefix_caching: bool = False,
    ) -> None:
        self.block_size = block_size
        self.policy = policy if policy is not None else PagedAllocation(block_size)
        if enable_prefix_caching and not self.policy.shares_blocks:
            raise ValueError(
                f"enable_prefix_caching needs a sharing policy, not {self.policy.name!r}")
        self.enable_prefix_caching = enable_prefix_caching
        self.device_pool = BlockPool(num_device_blocks, enable_caching=enable_prefix_caching)
        self.cpu_pool = BlockPool(num_cpu_blocks, name="cpu")
        self.watermark_blocks = int(watermark * num_device_blocks)
        self.prefix_cache_stats = PrefixCacheStats()

    @classmethod
    def from_config(cls, cache_config: CacheConfig, max_model_len: int, num_device_blocks: int,
                    num_cpu_blocks: int) -> BlockManager:
        policy = make_kv_allocation(cache_config.kv_allocation, cache_config.block_size,
                                    max_model_len)
        return cls(cache_config.block_size, num_device_blocks, num_cpu_blocks, policy=policy,
                   watermark=cache_config.watermark,
                   enable_prefix_caching=cache_config.enable_prefix_caching)

    # ------------------------------------------------------------------ admission

    @property
    def admission_capacity(self) -> int:
        """The most device blocks one request may need at admission and still ever fit."""
        return self.device_pool.num_blocks - self.watermark_blocks

    def num_required_blocks(self, seq_group: SequenceGroup) -> int:
        """Device blocks the group's waiting sequences need, ignoring prefix-cache hits.

        Forks to come count too when the policy cannot share blocks with them.
        """
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        blocks = sum(self.policy.num_blocks_for(seq.num_tokens) for seq in waiting)
        return blocks + self._num_fork_blocks(seq_group)

    def _num_fork_blocks(self, seq_group: SequenceGroup) -> int:
        """Blocks of the forks a request will make, when the policy cannot share with them."""
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        if self.policy.shares_blocks or not waiting:
            return 0
        num_forks = seq_group.max_num_running_seqs() - seq_group.num_unfinished_seqs()
        return num_forks * self.policy.num_blocks_for(waiting[0].num_tokens)

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        if self.num_required_blocks(seq_group) > self.admission_capacity:
            return AllocStatus.NEVER
        needed = self._num_free_blocks_to_admit(seq_group)
        if self.device_pool.num_free_blocks - needed >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give each waiting sequence blocks for all its tokens, reusing prefix-cache hits."""
        needed = self._num_free_blocks_to_admit(seq_group)
        if needed > self.device_pool.num_free_blocks:
            raise BlockAllocationError(
                f"request {seq_group.request_id!r} needs {needed} free device blocks, "
                f"{self.device_pool.num_free_blocks} are free")
        # Every sequence's hits are pinned before any new block is taken: a new block may
        # evict a free cached one, and a sibling's hit evicted would cut its chain short.
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in waiting:
            if seq.block_table:
                raise BlockAllocationError(f"sequence {seq.seq_id} already holds blocks")
        hits = [self._find_cache_hits(seq, seq_group.cache_salt) for seq in waiting]
        for block_id in (b for seq_hits in hits for b in seq_hits):
            self.device_pool.incref(block_id)
        for seq, seq_hits in zip(waiting, hits, strict=True):
            self._allocate_seq(seq, seq_hits)

    def _num_free_blocks_to_admit(self, seq_group: SequenceGroup) -> int:
        # A hit on a free cached block takes it off the free queue, so it counts like a new one.
        revived: set[int] = set()
        new_blocks = 0
        for seq in seq_group.get_seqs(SequenceStatus.WAITING):
            hits = self._find_cache_hits(seq, seq_group.cache_salt)
            revived.update(b for b in hits if self.device_pool.ref_cnt(b) == 0)
            new_blocks += self.policy.num_blocks_for(seq.num_tokens) - len(hits)
        return new_blocks + len(revived) + self._num_fork_blocks(seq_group)

    def _allocate_seq(self, seq: Sequence, hits: list[int]) -> None:
        """Gives ``seq`` its ``hits`` (already referenced for it) and new blocks after them."""
        num_new = self.policy.num_blocks_for(seq.num_tokens) - len(hits)
        seq.block_table = hits + [self.device_pool.allocate() for _ in range(num_new)]
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        if self.enable_prefix_caching:
            self.prefix_cache_stats.record(seq.num_tokens, seq.num_cached_tokens)

    def _block_hashes(self, seq: Sequence, cache_salt: str | None) -> list[BlockHash]:
        """``seq.block_hashes``, first extended to every full block of its tokens."""
        seq.block_hashes.extend(new_block_hashes(seq.token_ids, seq.block_size,
                                                 seq.block_hashes, cache_salt))
        return seq.block_hashes

    def _find_cache_hits(self, seq: Sequence, cache_salt: str | None) -> list[int]:
        """Device blocks caching the longest prefix of ``seq``'s full blocks that may be hit."""
        if not self.enable_prefix_caching:
            return []
        hashes = self._block_hashes(seq, cache_salt)
        hits: list[int] = []
        for block_hash in hashes[:max_cache_hit_blocks(seq.num_tokens, self.block_size)]:
            block_id = self.device_pool.get_cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    # ------------------------------------------------------------------ growth and sharing

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """Whether every running sequence can get slots for all its uncomputed tokens."""
        seqs = seq_group.get_seqs(SequenceStatus.RUNNING)
        return self._num_blocks_to_append_all(seqs, self.device_pool) <= (
            self.device_pool.num_free_blocks)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> BlockMapping:
        """Make the next ``num_new_tokens`` slots writable; returns copy-on-write (src, dst).

        A shared block about to be written is replaced by a private copy; a sequence whose
        last block is full gets a new one.
        """
        end = seq.num_computed_tokens + num_new_tokens
        if num_new_tokens < 1 or end > seq.num_tokens:
            raise ValueError(
                f"num_new_tokens must be in [1, {seq.num_uncomputed_tokens}] for sequence "
                f"{seq.seq_id}, got {num_new_tokens}")
        needed = self._num_blocks_to_append(seq, self.device_pool, end)
        if needed > self.device_pool.num_free_blocks:
            raise BlockAllocationError(
                f"sequence {seq.seq_id} needs {needed} free device blocks, "
                f"{self.device_pool.num_free_blocks} are free")
        copies = self._copy_on_write(seq, end)
        table = seq.block_table
        while len(table) < self.policy.num_blocks_for(end):
            table.append(self.device_pool.allocate())
        return copies

    def _copy_on_write(self, seq: Sequence, end: int) -> BlockMapping:
        copies: BlockMapping = []
        table = seq.block_table
        for index in self._written_block_indices(seq, end):
            src = table[index]
            if self.device_pool.ref_cnt(src) > 1:
                dst = self.device_pool.allocate()
                self.device_pool.free(src)
                table[index] = dst
                copies.append((src, dst))
        return copies

    def _written_block_indices(self, seq: Sequence, end: int) -> range:
        """Indices of the blocks already in the table that tokens up to ``end`` write into."""
        stop = min(len(seq.block_table), cdiv(end, self.block_size))
        return range(seq.num_computed_tokens // self.block_size, stop)

    def _num_blocks_to_append(self, seq: Sequence, pool: BlockPool, end: int) -> int:
        table = seq.block_table
        shared = sum(1 for index in self._written_block_indices(seq, end)
                     if pool.ref_cnt(table[index]) > 1)
        return shared + max(self.policy.num_blocks_for(end) - len(table), 0)

    def _num_blocks_to_append_all(self, seqs: list[Sequence], pool: BlockPool) -> int:
        """New blocks for all of ``seqs``' uncomputed tokens. Of the w sequences writing into a
        block with r references only the first min(w, r - 1) copy it: the last one left
        owns the original."""
        if len(seqs) == 1:  # one writer: the per-block count is the plain rule
            return self._num_blocks_to_append(seqs[0], pool, seqs[0].num_tokens)
        writers: Counter[int] = Counter()
        num_grown = 0
        for seq in seqs:
            table = seq.block_table
            writers.update(table[i] for i in self._written_block_indices(seq, seq.num_tokens))
            num_grown += max(self.policy.num_blocks_for(seq.num_tokens) - len(table), 0)
        num_copies = sum(min(count, pool.ref_cnt(block_id) - 1)
                         for block_id, count in writers.items())
        return num_copies + num_grown

    def can_fork(self, parent: Sequence) -> bool:
        if self.policy.shares_blocks:
            return True
        return len(parent.block_table) <= self.device_pool.num_free_blocks

    def fork(self, parent: Sequence, child: Sequence) -> BlockMapping:
        """Give ``child`` (a fork of ``parent``) its blocks: shared, or copied if the policy
        cannot share; returns the copies (src, dst) to do before the next step."""
        if self.policy.shares_blocks:
            child.block_table = list(parent.block_table)
            for block_id in child.block_table:
                self.device_pool.incref(block_id)
            return []
        if not self.can_fork(parent):
            raise BlockAllocationError(
                f"fork of sequence {parent.seq_id} needs {len(parent.block_table)} free device "
                f"blocks, {self.device_pool.num_free_blocks} are free")
        child.block_table = [self.device_pool.allocate() for _ in parent.block_table]
        num_filled = cdiv(parent.num_computed_tokens, self.block_size)
        return list(zip(parent.block_table[:num_filled], child.block_table[:num_filled],
                        strict=True))

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, last block first so a cached chain's tail is
        evicted before its head."""
        pool = self.cpu_pool if seq.status is SequenceStatus.SWAPPED else self.device_pool
        for block_id in reversed(seq.block_table):
            pool.free(block_id)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def cache_computed_blocks(self, seq: Sequence, cache_salt: str | None) -> None:
        """Offer the prefix cache every block that is now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        hashes = self._block_hashes(seq, cache_salt)
        num_full = min(seq.num_computed_tokens // self.block_size, len(hashes))
        for index in range(seq.num_registered_blocks, num_full):
            self.device_pool.cache_block(seq.block_table[index], hashes[index])
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    # ------------------------------------------------------------------ swapping

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        blocks = _distinct_blocks(seq_group.get_seqs(SequenceStatus.RUNNING))
        return len(blocks) <= self.cpu_pool.num_free_blocks

    def swap_out(self, seq_group: SequenceGroup) -> BlockMapping:
        """Move the running sequences' blocks to CPU; returns (device, cpu) copies."""
        seqs = seq_group.get_seqs(SequenceStatus.RUNNING)
        if not self.can_swap_out(seq_group):
            raise BlockAllocationError(
                f"request {seq_group.request_id!r} needs {len(_distinct_blocks(seqs))} free cpu "
                f"blocks, {self.cpu_pool.num_free_blocks} are free")
        return self._move(seqs, self.device_pool, self.cpu_pool)

    def can_swap_in(self, seq_group: SequenceGroup, use_watermark: bool = True) -> bool:
        """Whether the swapped blocks, plus the new ones their next step needs, fit (above the
        watermark unless ``use_watermark`` is False)."""
        seqs = seq_group.get_seqs(SequenceStatus.SWAPPED)
        needed = len(_distinct_blocks(seqs)) + self._num_blocks_to_append_all(seqs, self.cpu_pool)
        reserve = self.watermark_blocks if use_watermark else 0
        return self.device_pool.num_free_blocks - needed >= reserve

    def swap_in(self, seq_group: SequenceGroup) -> BlockMapping:
        """Move the swapped sequences' blocks back to the device; returns (cpu, device) copies."""
        seqs = seq_group.get_seqs(SequenceStatus.SWAPPED)
        needed = len(_distinct_blocks(seqs))
        if needed > self.device_pool.num_free_blocks:
            raise BlockAllocationError(
                f"request {seq_group.request_id!r} needs {needed} free device blocks, "
                f"{self.device_pool.num_free_blocks} are free")
        mapping = self._move(seqs, self.cpu_pool, self.device_pool)
        for seq in seqs:
            seq.num_registered_blocks = 0  # new device blocks: offer them to the cache again
        return mapping

    @staticmethod
    def _move(seqs: list[Sequence], src: BlockPool, dst: BlockPool) -> BlockMapping:
        # Each physical block moves once, so blocks shared before stay shared after.
        mapping: dict[int, int] = {}
        for seq in seqs:
            for block_id in seq.block_table:
                if block_id in mapping:
                    dst.incref(mapping[block_id])
                else:
                    mapping[block_id] = dst.allocate()
        for seq in seqs:
            for block_id in reversed(seq.block_table):
                src.free(block_id)
            seq.block_table = [mapping[block_id] for block_id in seq.block_table]
        return list(mapping.items())

    # ------------------------------------------------------------------ accounting

    def usage(self) -> KVCacheUsage:
        """Block counts of both pools (O(1))."""
        return KVCacheUsage(
            block_size=self.block_size,
            device=PoolUsage.of(self.device_pool),
            cpu=PoolUsage.of(self.cpu_pool),
            num_evictions=self.device_pool.num_evictions,
        )

    def check_integrity(self, device_seqs: Iterable[Sequence],
                        cpu_seqs: Iterable[Sequence] = ()) -> None:
        """Raise AssertionError unless the pools agree exactly with these live block tables
        (see :func:`check_block_integrity`)."""
        check_block_integrity(self, device_seqs, cpu_seqs)


def _distinct_blocks(seqs: Iterable[Sequence]) -> set[int]:
    return {block_id for seq in seqs for block_id in seq.block_table}
