"""Prefix caching: chained hashes of full blocks, and the hit / query counters.

A full block is identified by everything that determines its KV: the tokens before it (through
its parent's hash), its own tokens, and an extra key (the request's cache salt). The hash is a
SHA-256 digest, so two different prefixes practically never share a value, and a
:class:`BlockHash` compares its own token ids as well, so even a colliding digest is never a
hit for different tokens. The hash itself lives in ``pagedserve.common.block_hash``, shared
with the router's prefix policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.common.block_hash import BlockHash, hash_block_tokens

__all__ = ["BlockHash", "PrefixCacheStats", "hash_block_tokens", "max_cache_hit_blocks",
           "new_block_hashes"]


def new_block_hashes(token_ids: list[int], block_size: int, hashes: list[BlockHash],
                     extra_key: str | None) -> list[BlockHash]:
    """The hashes of the full blocks of ``token_ids`` after the ``len(hashes)`` already hashed
    (``hashes``), each chained to the one before it. Changes nothing: the block manager
    records them in the sequence."""
    parent = hashes[-1] if hashes else None
    found = []
    for index in range(len(hashes), len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[index * block_size:(index + 1) * block_size],
                                   extra_key)
        found.append(parent)
    return found


def max_cache_hit_blocks(num_tokens: int, block_size: int) -> int:
    """Most leading blocks a hit may cover: the last token is always computed, because the
    step that computes it is the one that produces the logits to sample from."""
    return max(num_tokens - 1, 0) // block_size


@dataclass(slots=True)
class PrefixCacheStats:
    """Token-level counters since start (a preempted request queried again counts again)."""

    num_requests: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    def record(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_requests += 1
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        if self.num_queried_tokens == 0:
            return 0.0
        return self.num_hit_tokens / self.num_queried_tokens
