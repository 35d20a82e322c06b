"""How full the KV cache pools are: each pool's block counts (``PoolUsage``) and both pools
together (``KVCacheUsage``), as the block manager reports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedserve.server.engine.core.block_pool import BlockPool


@dataclass(slots=True, frozen=True)
class PoolUsage:
    """Block counts of one pool; cached free blocks count as free (allocating evicts them)."""

    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_cached_free_blocks: int

    @classmethod
    def of(cls, pool: BlockPool) -> PoolUsage:
        return cls(
            num_blocks=pool.num_blocks,
            num_used_blocks=pool.num_used_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_cached_blocks=pool.num_cached_blocks,
            num_cached_free_blocks=pool.num_cached_free_blocks,
        )

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks in use (0 for an empty pool)."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0


@dataclass(slots=True, frozen=True)
class KVCacheUsage:
    block_size: int
    device: PoolUsage
    cpu: PoolUsage
    num_evictions: int

    @property
    def kv_cache_usage(self) -> float:
        return self.device.usage

    @property
    def free_token_capacity(self) -> int:
        """Token slots in free device blocks: what new work can take without preemption."""
        return self.device.num_free_blocks * self.block_size
