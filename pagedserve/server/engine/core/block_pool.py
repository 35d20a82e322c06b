"""One pool of physical KV blocks (the device cache or the CPU swap space)."""

from __future__ import annotations

from pagedserve.common.engine_errors import BlockAllocationError
from pagedserve.server.engine.core.block import FreeBlockQueue, KVCacheBlock
from pagedserve.server.engine.core.prefix_cache import BlockHash


class BlockPool:
    """Ref-counted blocks, a free queue, and (with caching) the prefix cache's hash map.

    A block is *used* while its ref count is positive and *free* otherwise; a free block may
    still be *cached* (it keeps its hash and can be revived by :meth:`incref`) until
    :meth:`allocate` reuses it, which evicts it from the cache. Reuse order: freed uncached
    blocks first (the free queue's head), then blocks never used yet in id order, then cached
    blocks least recently freed first (the free queue's tail).

    A block's bookkeeping object is made when the block is first allocated: ``blocks`` holds
    the blocks used so far, ids ``0 .. len(blocks) - 1``, and the rest of the ``num_blocks``
    are free and cache nothing. A small model on a large GPU has tens of millions of blocks;
    making 15.5 million of them up front took 14 s and 1.8 GB of the engine's start-up.
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = False,
                 name: str = "device") -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be non-negative, got {num_blocks}")
        self.name = name
        self.enable_caching = enable_caching
        self._num_blocks = num_blocks
        self.blocks: list[KVCacheBlock] = []
        self.free_queue = FreeBlockQueue()
        self.cached_blocks: dict[BlockHash, KVCacheBlock] = {}
        self.num_evictions = 0
        self._num_cached_free = 0

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no reference, cached ones included (allocating evicts them)."""
        return len(self.free_queue) + self.num_unused_blocks

    @property
    def num_unused_blocks(self) -> int:
        """Blocks never allocated yet."""
        return self._num_blocks - len(self.blocks)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_queue)

    def free_block_ids(self) -> list[int]:
        """Every free block, in the order :meth:`allocate` would take them."""
        queue = list(self.free_queue)
        split = next((i for i, b in enumerate(queue) if b.block_hash is not None), len(queue))
        return [b.block_id for b in queue[:split]] + list(
            range(len(self.blocks), self._num_blocks)) + [b.block_id for b in queue[split:]]

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a prefix-cache entry, used or free."""
        return len(self.cached_blocks)

    @property
    def num_cached_free_blocks(self) -> int:
        return self._num_cached_free

    def ref_cnt(self, block_id: int) -> int:
        return self._get(block_id).ref_cnt

    def allocate(self) -> int:
        """Take the next free block (evicting its cache entry, if any) with one reference."""
        head = self.free_queue.peek()
        if (head is None or head.block_hash is not None) and len(self.blocks) < self._num_blocks:
            block = KVCacheBlock(len(self.blocks), ref_cnt=1)
            self.blocks.append(block)
            return block.block_id
        if head is None:
            raise BlockAllocationError(
                f"{self.name} pool is out of blocks (all {self.num_blocks} are in use)")
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            self._evict(block)
        block.ref_cnt = 1
        return block.block_id

    def free(self, block_id: int) -> None:
        """Drop one reference; the last one returns the block to the free queue."""
        block = self._get(block_id)
        if block.ref_cnt == 0:
            raise BlockAllocationError(f"double free of {self.name} block {block_id}")
        block.ref_cnt -= 1
        if block.ref_cnt > 0:
            return
        if block.block_hash is None:
            self.free_queue.appendleft(block)
        else:
            self.free_queue.append(block)
            self._num_cached_free += 1

    def incref(self, block_id: int) -> None:
        """Add a reference: sharing a used block, or reviving a free cached one (a hit)."""
        block = self._get(block_id)
        if block.ref_cnt == 0:
            if block.block_hash is None:
                raise BlockAllocationError(
                    f"{self.name} block {block_id} is free and caches nothing; allocate instead")
            self.free_queue.remove(block)
            self._num_cached_free -= 1
        block.ref_cnt += 1

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        """The block cached under ``block_hash`` (same digest, tokens and extra key), if any."""
        block = self.cached_blocks.get(block_hash)
        return None if block is None else block.block_id

    def cache_block(self, block_id: int, block_hash: BlockHash) -> bool:
        """Make a used, fully computed block the cache entry for ``block_hash``.

        Returns whether ``block_id`` is now that entry; when another block already holds the
        hash, that one stays the entry and this block remains uncached.
        """
        block = self._get(block_id)
        if block.ref_cnt == 0:
            raise BlockAllocationError(f"cannot cache free {self.name} block {block_id}")
        if not self.enable_caching:
            return False
        existing = self.cached_blocks.get(block_hash)
        if existing is not None:
            return existing is block
        if block.block_hash is not None:
            raise BlockAllocationError(
                f"{self.name} block {block_id} already caches another block hash")
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:  # a cached free block always has its hash
            del self.cached_blocks[block.block_hash]
        block.block_hash = None
        self._num_cached_free -= 1
        self.num_evictions += 1

    def _get(self, block_id: int) -> KVCacheBlock:
        """The block's bookkeeping; a block never used yet gets a throwaway free one."""
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            raise BlockAllocationError(
                f"unknown {self.name} block id {block_id!r} "
                f"(the pool has {self._num_blocks} blocks)")
        if block_id < len(self.blocks):
            return self.blocks[block_id]
        return KVCacheBlock(block_id)
