"""Shared inputs and naive references for the Triton kernel tests.

Caches are built the way the engine leaves them: physical blocks shuffled, block 0 and every
unwritten slot holding NaN (a kernel that reads past a sequence's end returns NaN), one spare
zero column in each block table (the contract says it is never read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NEEDS_CUDA = "needs a CUDA device"

# (atol, rtol) against a float64 reference computed from the same (rounded) inputs: the kernels
# accumulate in float32, so what remains is the output's rounding (and, on the GPU, the 16-bit
# probabilities fed to the tensor cores).
TOLERANCES = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@dataclass
class PagedKV:
    key_cache: torch.Tensor  # [N, B, Hkv, D]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, M]
    seq_lens: torch.Tensor  # int32 [S]

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]


def build_paged_kv(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    device: torch.device = DEVICE,
) -> PagedKV:
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    physical = torch.randperm(num_blocks - 1, generator=gen)[: sum(needed)] + 1
    tables = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    first = 0
    for seq, length in enumerate(seq_lens):
        tables[seq, : needed[seq]] = physical[first : first + needed[seq]]
        first += needed[seq]
        for pos in range(0, length, block_size):
            block, count = int(tables[seq, pos // block_size]), min(block_size, length - pos)
            rows = (count, num_kv_heads, head_dim)
            key_cache[block, :count] = torch.randn(rows, generator=gen)
            value_cache[block, :count] = torch.randn(rows, generator=gen)
    return PagedKV(
        key_cache.to(device, dtype),
        value_cache.to(device, dtype),
        tables.to(device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
    )


def random_queries(num_rows: int, num_heads: int, head_dim: int, dtype: torch.dtype,
                   seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, num_heads, head_dim, generator=gen).to(DEVICE, dtype)


def _sequence_kv(kv: PagedKV, seq: int, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions 0..len-1 of one sequence, float64, KV heads repeated to [L, H, D]."""
    length = int(kv.seq_lens[seq])
    positions = torch.arange(length)
    table = kv.block_tables[seq].cpu().long()
    blocks, offsets = table[positions // kv.block_size], positions % kv.block_size
    group = num_heads // kv.key_cache.shape[2]
    key = kv.key_cache.cpu()[blocks, offsets].double().repeat_interleave(group, dim=1)
    value = kv.value_cache.cpu()[blocks, offsets].double().repeat_interleave(group, dim=1)
    return key, value


def naive_prefill(query: torch.Tensor, kv: PagedKV, query_lens: list[int],
                  scale: float) -> torch.Tensor:
    """Float64 causal attention: row i of a q_len chunk sees positions <= len - q_len + i."""
    out = torch.empty(query.shape, dtype=torch.float64)
    start = 0
    for seq, q_len in enumerate(query_lens):
        key, value = _sequence_kv(kv, seq, query.shape[1])
        rows = query[start : start + q_len].cpu().double()  # [Q, H, D]
        scores = torch.einsum("qhd,lhd->hql", rows, key) * scale
        last = key.shape[0] - q_len + torch.arange(q_len)
        hidden = torch.arange(key.shape[0])[None, :] > last[:, None]
        weights = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
        out[start : start + q_len] = torch.einsum("hql,lhd->qhd", weights, value)
        start += q_len
    return out


def naive_decode(query: torch.Tensor, kv: PagedKV, scale: float) -> torch.Tensor:
    return naive_prefill(query, kv, [1] * query.shape[0], scale)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.cpu().double(), expected.cpu().double(), atol=atol,
                               rtol=rtol)
