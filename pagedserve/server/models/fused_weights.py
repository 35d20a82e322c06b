"""Checkpoint tensors that stack several projections in one (Phi-3's ``qkv_proj`` and
``gate_up_proj``), split into their parts unread: each part is a range of the stored tensor's
rows and loads as the separate projection would (tensor-parallel shards included)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from pagedserve.server.models.base import FusedTensors
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.weight_slot import TensorSource, source_shape

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RowRange:
    """Rows ``start : start + size`` of an unread tensor, itself a ``TensorSource``."""

    source: torch.Tensor | TensorSource
    start: int
    size: int

    def get_shape(self) -> tuple[int, ...]:
        return (self.size, *source_shape(self.source)[1:])

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        first, rest = index[0], index[1:]
        start, stop, step = first.indices(self.size)
        if step != 1:
            raise ValueError(f"a row range reads contiguous rows, got step {step}")
        return self.source[(slice(self.start + start, self.start + stop), *rest)]


def row_range(name: str, tensor: Any, start: int, size: int) -> RowRange:
    return RowRange(tensor, start, size)


def split_fused(
    weights: Iterable[tuple[str, T]], fused: FusedTensors, architecture: str,
    cut: Callable[[str, T, int, int], T] = row_range,
) -> Iterator[tuple[str, T]]:
    """``weights`` with each fused tensor (a weight or bias of a module named in ``fused``)
    replaced by its parts, named as their own modules; ``cut(part_name, tensor, start, rows)``
    takes a part's rows."""
    for name, tensor in weights:
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        parts = fused.get(leaf)
        if parts is None:
            yield name, tensor
            continue
        rows = source_shape(tensor)[0]
        total = sum(size for _, size in parts)
        if rows != total:
            stacked = " + ".join(f"{part} {size}" for part, size in parts)
            raise ModelLoadError(f"checkpoint weight {name!r} has {rows} rows; {architecture} "
                                 f"stacks {stacked} = {total} rows in it")
        start = 0
        for part, size in parts:
            part_name = f"{parent}.{part}.{kind}" if parent else f"{part}.{kind}"
            yield part_name, cut(part_name, tensor, start, size)
            start += size
