"""Prefix caching: chained hashes of full blocks, and the hit / query counters.

A full block is identified by everything that determines its KV: the tokens before it (through
its parent's hash), its own tokens, and an extra key (the request's cache salt). The hash is a
SHA-256 digest, so two different prefixes practically never share a value, and a
:class:`BlockHash` compares its own token ids as well, so even a colliding digest is never a
hit for different tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedserve.server.engine.sequence import Sequence


@dataclass(frozen=True, slots=True, eq=True)
class BlockHash:
    """The identity of one full block in the prefix cache."""

    hash_value: bytes
    token_ids: tuple[int, ...]
    extra_key: str | None = None

    def __hash__(self) -> int:
        # Dict lookups hash only the digest; equality then also checks tokens and extra key.
        return hash(self.hash_value)


def hash_block_tokens(
    parent: BlockHash | None, token_ids: SequenceABC[int], extra_key: str | None = None
) -> BlockHash:
    """The hash of a full block whose predecessor hashed to ``parent`` (None: first block)."""
    digest = hashlib.sha256(parent.hash_value if parent is not None else b"pagedserve-root")
    digest.update(array("q", token_ids).tobytes())
    # The marker byte keeps "no salt" distinct from the empty salt.
    digest.update(b"\x00" if extra_key is None else b"\x01" + extra_key.encode())
    return BlockHash(digest.digest(), tuple(token_ids), extra_key)


def update_block_hashes(seq: Sequence, extra_key: str | None) -> list[BlockHash]:
    """Hash every full block of ``seq.token_ids`` not hashed yet; returns ``seq.block_hashes``."""
    hashes = seq.block_hashes
    size = seq.block_size
    for index in range(len(hashes), len(seq.token_ids) // size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(parent, seq.token_ids[index * size:(index + 1) * size],
                                        extra_key))
    return hashes


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
