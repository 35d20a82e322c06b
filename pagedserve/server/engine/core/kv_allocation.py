"""How many blocks a sequence holds, and whether sequences may share them.

The block manager asks its policy two questions and nothing else, so the baseline that the
memory benchmark compares against differs from the product in exactly these answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVAllocationPolicy(ABC):
    """The block budget of one sequence."""

    name: str
    # Whether forks share blocks (copy-on-write) and prefix-cache hits reuse them.
    shares_blocks: bool

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    @abstractmethod
    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks a sequence must hold while it stores ``num_tokens`` tokens."""


class PagedAllocation(KVAllocationPolicy):
    """PagedAttention: blocks on demand, so only a sequence's last block has unused slots."""

    name = "paged"
    shares_blocks = True

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)


class ContiguousAllocation(KVAllocationPolicy):
    """Pre-paging serving systems: each sequence reserves room for ``max_model_len`` tokens at
    admission, because its output length is unknown; nothing is shared."""

    name = "contiguous"
    shares_blocks = False

    def __init__(self, block_size: int, max_model_len: int) -> None:
        super().__init__(block_size)
        self.max_model_len = max_model_len
        self.num_reserved_blocks = cdiv(max_model_len, block_size)

    def num_blocks_for(self, num_tokens: int) -> int:
        return max(self.num_reserved_blocks, cdiv(num_tokens, self.block_size))


def make_kv_allocation(name: str, block_size: int, max_model_len: int) -> KVAllocationPolicy:
    """The policy called ``name`` (``CacheConfig.kv_allocation``)."""
    if name == "paged":
        return PagedAllocation(block_size)
    if name == "contiguous":
        return ContiguousAllocation(block_size, max_model_len)
    raise ValueError(f"kv_allocation must be one of paged, contiguous, got {name!r}")
