"""The prefix cache's block hash: a full block's identity, chained from its parent.

A leaf module (hashlib only), so that the engine's prefix cache, the router's prefix policy and
the client all hash the same way: two prompts that share their first k blocks share their
first k chained hashes, whoever computes them.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

_ROOT = b"pagedserve-root"


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
    parent: BlockHash | None, token_ids: Sequence[int], extra_key: str | None = None
) -> BlockHash:
    """The hash of a full block whose predecessor hashed to ``parent`` (None: first block)."""
    digest = hashlib.sha256(parent.hash_value if parent is not None else _ROOT)
    digest.update(array("q", token_ids).tobytes())
    # The marker byte keeps "no salt" distinct from the empty salt.
    digest.update(b"\x00" if extra_key is None else b"\x01" + extra_key.encode())
    return BlockHash(digest.digest(), tuple(token_ids), extra_key)


def hash_prefix_blocks(token_ids: Sequence[int], block_size: int, max_blocks: int,
                       extra_key: str | None = None) -> list[BlockHash]:
    """The chained hashes of the leading full blocks of ``token_ids``, at most ``max_blocks``."""
    hashes: list[BlockHash] = []
    for index in range(min(len(token_ids) // block_size, max_blocks)):
        parent = hashes[-1] if hashes else None
        block = token_ids[index * block_size:(index + 1) * block_size]
        hashes.append(hash_block_tokens(parent, block, extra_key))
    return hashes
