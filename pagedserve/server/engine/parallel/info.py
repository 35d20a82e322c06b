"""What /metrics and the start-up log state about the split: fixed once the engine is up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParallelInfo:
    tensor_parallel_size: int
    kv_blocks_per_rank: int  # the same on every rank: the block tables are shared
    kv_bytes_per_rank: int  # device memory of one rank's KV shard
    cpu_kv_blocks_per_rank: int
