"""Megatron-style tensor-parallel layers; with a group of one rank they are plain layers.

- Column-parallel linear: the output features are split, each rank computes its slice of the
  output, no communication. QKV, gate/up and OPT's fc1.
- Row-parallel linear: the input features are split (the column-parallel layer's output
  slice), each rank computes a partial sum, one all-reduce adds them, the bias once after.
- Vocabulary-parallel embedding and LM head: the vocabulary is split (padded to a multiple of
  the ranks); the embedding all-reduces rows that only their owner filled, the head gathers
  its logit slices on rank 0, the only rank that samples.

KV heads split like query heads; with fewer KV heads than ranks each rank holds one KV head,
replicated across the ranks whose query heads share it (as vLLM does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.dispatch import LinearPacking
from pagedserve.kernels.quantized_linear import (
    QuantizedTable,
    QuantizedWeight,
    QuantKernel,
    dequantize,
    take_rows,
)
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.weight_slot import WeightSlot


def check_tensor_parallel(config: ModelConfig, size: int) -> None:
    """Refuses a split the model's shape does not allow, naming the numbers."""
    if not isinstance(size, int) or size < 1:
        raise ModelLoadError(f"tensor_parallel_size must be a positive integer, got {size!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % size:
        raise ModelLoadError(f"num_attention_heads {heads} is not divisible by "
                             f"tensor_parallel_size {size}")
    if kv_heads >= size and kv_heads % size:
        raise ModelLoadError(f"num_key_value_heads {kv_heads} is not divisible by "
                             f"tensor_parallel_size {size}")
    if kv_heads < size and size % kv_heads:
        raise ModelLoadError(f"tensor_parallel_size {size} is not a multiple of "
                             f"num_key_value_heads {kv_heads} (with fewer KV heads than ranks, "
                             f"each KV head is replicated on an equal number of ranks)")
    if config.intermediate_size % size:
        raise ModelLoadError(f"intermediate_size {config.intermediate_size} is not divisible "
                             f"by tensor_parallel_size {size}")


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The attention shape one rank holds: its query heads and KV heads (what its KV cache
    stores). Everything else is the model's."""
    if size == 1:
        return config
    check_tensor_parallel(config, size)
    return replace(config, num_attention_heads=config.num_attention_heads // size,
                   num_key_value_heads=max(1, config.num_key_value_heads // size))


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One checkpoint projection inside a packed parameter: this rank reads ``size`` rows
    from ``start`` of the checkpoint tensor, which has ``full`` rows."""

    name: str
    full: int
    start: int
    size: int


def _even_specs(shards: dict[str, int], group: TensorParallelGroup) -> list[ShardSpec]:
    specs = []
    for name, full in shards.items():
        start, end = group.shard_range(full)
        specs.append(ShardSpec(name, full, start, end - start))
    return specs


class PackableLinear(nn.Module):
    """A projection whose weight a backend may prepack after loading (``pack``), or that holds
    a quantized weight in the layout of its kernel (``quantize``): the dense weight is then
    released, and every matmul reads the packed one."""

    weight: nn.Parameter | None
    packed: object | None = None
    packing: LinearPacking | QuantKernel | None = None
    # The dense weight's dtype and device, once it is released.
    run_dtype: torch.dtype | None = None
    run_device: torch.device | None = None

    def pack(self, packing: LinearPacking) -> None:
        assert self.weight is not None, "packed twice"
        self._release(packing, packing.pack(self.weight))

    def quantize(self, weight: QuantizedWeight, kernel: QuantKernel) -> None:
        """Runs on ``weight`` (this rank's shard, shaped as the dense one) with ``kernel``."""
        assert self.weight is not None, "packed twice"
        shape = (weight.out_features, weight.in_features)
        if shape != tuple(self.weight.shape):
            raise ModelLoadError(f"a quantized weight of shape {list(shape)} does not fit a "
                                 f"projection of shape {list(self.weight.shape)}")
        self._release(kernel, kernel.prepare(weight))

    def _release(self, packing: LinearPacking | QuantKernel, packed: object) -> None:
        self.run_dtype, self.run_device = self.weight.dtype, self.weight.device
        self.packed, self.packing = packed, packing
        self.weight = None  # a weight tied to an embedding stays there

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.packing is not None:
            return self.packing.linear(x, self.packed, bias)
        return F.linear(x, self.weight, bias)


class ColumnParallelLinear(PackableLinear):
    """``x W^T + b`` with the output features split across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 group: TensorParallelGroup) -> None:
        super().__init__()
        self.group = group
        start, end = group.shard_range(out_features)
        self.out_features, self.shard_start = out_features, start
        self.weight = nn.Parameter(torch.empty(end - start, in_features))
        self.bias = nn.Parameter(torch.empty(end - start)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def checkpoint_slots(self, prefix: str, param_name: str) -> list[tuple[str, WeightSlot]]:
        param = getattr(self, param_name)
        slot = WeightSlot(param, shard_dim=0, shard_start=self.shard_start,
                          shard_size=param.shape[0], full_size=self.out_features)
        return [(f"{prefix}.{param_name}", slot)]


class MergedColumnParallelLinear(PackableLinear):
    """One matmul for several checkpoint projections stacked along the output dim (vLLM's
    packed modules: ``qkv_proj`` holds ``q_proj``, ``k_proj``, ``v_proj``), each split across
    ranks as its ``ShardSpec`` says. The checkpoint names are siblings of this module's."""

    def __init__(self, in_features: int, specs: Sequence[ShardSpec], bias: bool) -> None:
        super().__init__()
        self.specs = tuple(specs)
        self.output_sizes = [spec.size for spec in self.specs]
        rows = sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(rows, in_features))
        self.bias = nn.Parameter(torch.empty(rows)) if bias else None

    @classmethod
    def even(cls, in_features: int, shards: dict[str, int], bias: bool,
             group: TensorParallelGroup) -> MergedColumnParallelLinear:
        return cls(in_features, _even_specs(shards, group), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def checkpoint_slots(self, prefix: str, param_name: str) -> list[tuple[str, WeightSlot]]:
        parent = prefix.rpartition(".")[0]
        param, slots, row = getattr(self, param_name), [], 0
        for spec in self.specs:
            name = f"{parent}.{spec.name}.{param_name}" if parent else f"{spec.name}.{param_name}"
            slots.append((name, WeightSlot(param, row, spec.size, shard_dim=0,
                                           shard_start=spec.start, shard_size=spec.size,
                                           full_size=spec.full)))
            row += spec.size
        return slots


def qkv_parallel_linear(hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                        bias: bool, group: TensorParallelGroup) -> MergedColumnParallelLinear:
    """``qkv_proj``: this rank's query heads, then its KV head(s) for K and for V."""
    q_start, q_end = group.shard_range(num_heads)
    if num_kv_heads >= group.world_size:
        kv_start, kv_end = group.shard_range(num_kv_heads)
    else:  # each KV head serves world_size / num_kv_heads consecutive ranks
        kv_start = group.rank * num_kv_heads // group.world_size
        kv_end = kv_start + 1
    d = head_dim
    specs = [ShardSpec("q_proj", num_heads * d, q_start * d, (q_end - q_start) * d)]
    specs += [ShardSpec(name, num_kv_heads * d, kv_start * d, (kv_end - kv_start) * d)
              for name in ("k_proj", "v_proj")]
    return MergedColumnParallelLinear(hidden_size, specs, bias)


class RowParallelLinear(PackableLinear):
    """``x W^T + b`` with the input features split: partial sums all-reduced, bias once."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 group: TensorParallelGroup) -> None:
        super().__init__()
        self.group = group
        start, end = group.shard_range(in_features)
        self.in_features, self.shard_start = in_features, start
        self.weight = nn.Parameter(torch.empty(out_features, end - start))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group.world_size == 1:
            return self.matmul(x, self.bias)
        y = self.group.all_reduce(self.matmul(x))
        return y if self.bias is None else y + self.bias

    def checkpoint_slots(self, prefix: str, param_name: str) -> list[tuple[str, WeightSlot]]:
        param = getattr(self, param_name)
        if param_name == "bias":
            return [(f"{prefix}.bias", WeightSlot(param))]
        slot = WeightSlot(param, shard_dim=1, shard_start=self.shard_start,
                          shard_size=param.shape[1], full_size=self.in_features)
        return [(f"{prefix}.weight", slot)]


def _vocab_part(vocab_size: int, group: TensorParallelGroup) -> tuple[int, int, int]:
    """(rows per rank, this rank's first id, ids it really owns): the last rank's part may
    be short, its padding rows stay zero."""
    per_rank = math.ceil(vocab_size / group.world_size)
    start = group.rank * per_rank
    return per_rank, start, max(0, min(per_rank, vocab_size - start))


class VocabParallelEmbedding(nn.Module):
    """Token embeddings, float or, after ``quantize``, looked up from a quantized table (each
    looked-up row dequantized)."""

    quantized: QuantizedWeight | QuantizedTable | None = None

    def __init__(self, vocab_size: int, embedding_dim: int,
                 group: TensorParallelGroup) -> None:
        super().__init__()
        self.group = group
        self.vocab_size, self.embedding_dim = vocab_size, embedding_dim
        per_rank, self.vocab_start, self.num_owned = _vocab_part(vocab_size, group)
        self.weight = nn.Parameter(torch.empty(per_rank, embedding_dim))

    def quantize(self, weight: QuantizedWeight | QuantizedTable) -> None:
        assert self.weight is not None, "quantized twice"
        shape = (weight.out_features, weight.in_features)
        if shape != tuple(self.weight.shape):
            raise ModelLoadError(f"a quantized embedding of shape {list(shape)} does not fit "
                                 f"a table of shape {list(self.weight.shape)}")
        self.run_dtype = self.weight.dtype
        self.quantized, self.weight = weight, None

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is None:
            return F.embedding(ids, self.weight)
        if isinstance(self.quantized, QuantizedTable):
            return self.quantized.rows(ids, self.run_dtype)
        return dequantize(take_rows(self.quantized, ids), self.run_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, dim]
        if self.group.world_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.vocab_start
        owned = (local >= 0) & (local < self.num_owned)
        rows = self._lookup(torch.where(owned, local, 0))
        return self.group.all_reduce(rows.masked_fill_(~owned[:, None], 0))

    def checkpoint_slots(self, prefix: str, param_name: str) -> list[tuple[str, WeightSlot]]:
        return [(f"{prefix}.{param_name}", _vocab_slot(self.weight, self.vocab_start,
                                                       self.num_owned, self.vocab_size))]


class ParallelLMHead(PackableLinear):
    """hidden [N, dim] -> float32 logits [N, vocab] on rank 0, None on the other ranks."""

    def __init__(self, vocab_size: int, embedding_dim: int,
                 group: TensorParallelGroup) -> None:
        super().__init__()
        self.group = group
        self.vocab_size = vocab_size
        per_rank, self.vocab_start, self.num_owned = _vocab_part(vocab_size, group)
        self.weight = nn.Parameter(torch.empty(per_rank, embedding_dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = self.group.gather_last_dim(self.matmul(hidden))
        return None if logits is None else logits[:, : self.vocab_size].float()

    def checkpoint_slots(self, prefix: str, param_name: str) -> list[tuple[str, WeightSlot]]:
        return [(f"{prefix}.{param_name}", _vocab_slot(self.weight, self.vocab_start,
                                                       self.num_owned, self.vocab_size))]

    @property
    def dtype(self) -> torch.dtype:
        return self.run_dtype if self.weight is None else self.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.run_device if self.weight is None else self.weight.device


def pack_linear_layers(model: nn.Module, packing: LinearPacking | None) -> int:
    """Prepacks every projection of ``model`` whose weight ``packing.worth_packing`` accepts,
    when the backend packs its dtype on its device; returns how many it packed."""
    layers = [m for m in model.modules() if isinstance(m, PackableLinear) and m.weight is not None]
    if packing is None or not layers:
        return 0
    weight = layers[0].weight
    if weight.device.type != "cpu" or not packing.supports(weight.dtype):
        return 0
    worth = packing.worth_packing
    chosen = [layer for layer in layers if worth is None or worth(layer.weight)]
    for layer in chosen:
        layer.pack(packing)
    return len(chosen)


def _vocab_slot(weight: nn.Parameter, start: int, owned: int, vocab_size: int) -> WeightSlot:
    return WeightSlot(weight, shard_dim=0, shard_start=start, shard_size=owned,
                      full_size=vocab_size)
