"""Physical KV blocks and the free queue that orders their reuse."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pagedserve.server.engine.core.prefix_cache import BlockHash


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Bookkeeping of one physical block of ``block_size`` token slots.

    ``block_hash`` is set while the block is the prefix cache's entry for that hash; it stays
    set after the last reference is dropped, so a later request can revive the block until it
    is evicted. ``prev_free`` / ``next_free`` link the block into the free queue.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free: KVCacheBlock | None = field(default=None, repr=False)
    next_free: KVCacheBlock | None = field(default=None, repr=False)
    in_free_queue: bool = False


class FreeBlockQueue:
    """Doubly linked list of the blocks with no reference, in the order they will be reused.

    Eviction order: :meth:`popleft` takes the head. Blocks that cache nothing are put at the
    head (they are worth nothing, so they are reused first); blocks that cache a prefix are put
    at the tail when freed, so cached blocks are evicted least recently freed first. A sequence
    frees its blocks tail first, hence the tail of a cached chain is evicted before its head,
    and a chain is never left with a cached block whose parent is gone. :meth:`remove` takes a
    cached block out in O(1) when a prefix hit revives it.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self._head: KVCacheBlock | None = None
        self._tail: KVCacheBlock | None = None
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self._head
        while node is not None:
            yield node
            node = node.next_free

    def peek(self) -> KVCacheBlock | None:
        return self._head

    def popleft(self) -> KVCacheBlock:
        block = self._head
        if block is None:
            raise IndexError("pop from an empty free block queue")
        self.remove(block)
        return block

    def append(self, block: KVCacheBlock) -> None:
        self._check_absent(block)
        block.prev_free, block.next_free = self._tail, None
        if self._tail is None:
            self._head = block
        else:
            self._tail.next_free = block
        self._tail = block
        self._added(block)

    def appendleft(self, block: KVCacheBlock) -> None:
        self._check_absent(block)
        block.prev_free, block.next_free = None, self._head
        if self._head is None:
            self._tail = block
        else:
            self._head.prev_free = block
        self._head = block
        self._added(block)

    def remove(self, block: KVCacheBlock) -> None:
        if not block.in_free_queue:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        if block.prev_free is None:
            self._head = block.next_free
        else:
            block.prev_free.next_free = block.next_free
        if block.next_free is None:
            self._tail = block.prev_free
        else:
            block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        block.in_free_queue = False
        self._len -= 1

    def _added(self, block: KVCacheBlock) -> None:
        block.in_free_queue = True
        self._len += 1

    @staticmethod
    def _check_absent(block: KVCacheBlock) -> None:
        if block.in_free_queue:
            raise ValueError(f"block {block.block_id} is already in the free queue")
