"""Launch configurations and the small heuristics that choose them.

``@triton.autotune`` is avoided on purpose: it benchmarks on the first call of every new shape
(a stall inside serving) and cannot run under the interpreter. Each op instead picks one fixed
configuration from the sizes it already knows, without reading any tensor contents.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import AttentionShape
from .runtime import cdiv, next_power_of_2

# tl.dot needs every matrix side to be at least 16 on the GPU.
MIN_DOT_SIZE = 16
# Several resident programs per SM hide the latency of the gathered K/V loads.
TARGET_PROGRAMS_PER_SM = 4
# A split shorter than this spends more on writing and reducing partials than it saves.
MIN_PARTITION_SIZE = 256
# Rows of a prefill tile: (query tokens) x (query heads of one KV head).
PREFILL_TILE_ROWS = 64
MAX_KV_TILE = 64
# One Q tile plus one K and one V tile. The compiled kernels then stay within the shared memory
# of every supported GPU (99 KiB on sm_86/89), which compile_check verifies.
TILE_BUDGET_BYTES = 64 * 1024


def padded_head_dim(head_dim: int) -> int:
    """Head dims such as 80 or 96 run as the next power of two with the tail masked off."""
    return max(MIN_DOT_SIZE, next_power_of_2(head_dim))


def padded_group_size(group_size: int) -> int:
    return max(MIN_DOT_SIZE, next_power_of_2(group_size))


def _fit_tiles(rows: int, head_dim: int, element_size: int, min_rows: int) -> tuple[int, int]:
    """(rows, kv_tile) whose Q tile plus K and V tiles fit ``TILE_BUDGET_BYTES``: the KV tile
    shrinks first (down to 16 tokens), then the query rows (down to ``min_rows``)."""
    kv_tile = MAX_KV_TILE
    row_bytes = padded_head_dim(head_dim) * element_size

    def tile_bytes() -> int:
        return (rows + 2 * kv_tile) * row_bytes

    while tile_bytes() > TILE_BUDGET_BYTES and kv_tile > MIN_DOT_SIZE:
        kv_tile //= 2
    while tile_bytes() > TILE_BUDGET_BYTES and rows > min_rows:
        rows //= 2
    return rows, kv_tile


def _require_tile(name: str, value: int) -> None:
    if value < MIN_DOT_SIZE or value & (value - 1):
        raise ValueError(f"{name} {value} must be a power of two >= {MIN_DOT_SIZE}")


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """``kv_tile`` context tokens per loop step; ``partition_size`` tokens per split program
    (None: one program walks the whole context, no reduce pass)."""

    kv_tile: int
    partition_size: int | None = None
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        _require_tile("kv_tile", self.kv_tile)
        if self.partition_size is not None and (
            self.partition_size <= 0 or self.partition_size % self.kv_tile
        ):
            raise ValueError(
                f"partition_size {self.partition_size} must be a positive multiple of "
                f"kv_tile {self.kv_tile}"
            )

    def num_splits(self, max_context_len: int) -> int:
        if self.partition_size is None:
            return 1
        return max(1, cdiv(max_context_len, self.partition_size))


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """``block_q`` query tokens (times the query heads of one KV head) per program,
    ``kv_tile`` context tokens per loop step."""

    block_q: int
    kv_tile: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        _require_tile("kv_tile", self.kv_tile)
        if self.block_q < 1 or self.block_q & (self.block_q - 1):
            raise ValueError(f"block_q {self.block_q} must be a power of two >= 1")


def choose_decode_config(
    shape: AttentionShape, num_seqs: int, sm_count: int, element_size: int = 2
) -> DecodeConfig:
    """Split the context across programs only when one program per (sequence, KV head)
    leaves the device underfilled and the context is long enough to be worth splitting.

    The block-table width bounds the context (no sync to read the true lengths), so the
    engine should size ``block_tables`` to the batch's longest sequence.
    """
    group_pad = padded_group_size(shape.group_size)
    _, kv_tile = _fit_tiles(group_pad, shape.head_dim, element_size, min_rows=group_pad)
    max_context_len = shape.max_blocks_per_seq * shape.block_size
    programs = max(1, num_seqs * shape.num_kv_heads)
    wanted = cdiv(sm_count * TARGET_PROGRAMS_PER_SM, programs)
    num_splits = min(wanted, cdiv(max_context_len, MIN_PARTITION_SIZE))
    if num_splits <= 1:
        return DecodeConfig(kv_tile=kv_tile)
    partition = cdiv(cdiv(max_context_len, num_splits), kv_tile) * kv_tile
    return DecodeConfig(kv_tile=kv_tile, partition_size=partition)


def choose_prefill_config(shape: AttentionShape, element_size: int = 2) -> PrefillConfig:
    group_pad = next_power_of_2(shape.group_size)
    rows = max(PREFILL_TILE_ROWS, group_pad)
    rows, kv_tile = _fit_tiles(rows, shape.head_dim, element_size,
                               min_rows=max(MIN_DOT_SIZE, group_pad))
    return PrefillConfig(block_q=rows // group_pad, kv_tile=kv_tile)
