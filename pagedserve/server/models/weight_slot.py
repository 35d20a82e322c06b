"""Where one checkpoint tensor, or this rank's part of it, lands in a model parameter.

A module that stores checkpoint tensors differently from its own parameter names (packed
projections, tensor-parallel shards) defines ``checkpoint_slots(prefix, param_name)``; the
loader asks every other parameter for the whole tensor under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn


class TensorSource(Protocol):
    """A checkpoint tensor not yet read: a ``torch.Tensor`` or a safetensors slice, both
    indexable with slices so that a rank reads only its own part."""

    def __getitem__(self, index: Any) -> torch.Tensor: ...


def source_shape(source: torch.Tensor | Any) -> tuple[int, ...]:
    if isinstance(source, torch.Tensor):
        return tuple(source.shape)
    return tuple(source.get_shape())


@dataclass(slots=True)
class WeightSlot:
    """Rows ``start : start + rows`` of ``param`` (all of it when ``rows`` is None) take
    ``[shard_start, shard_start + shard_size)`` along ``shard_dim`` of a checkpoint tensor
    that is ``full_size`` long there (the whole tensor when ``shard_dim`` is None). Target rows
    beyond what the checkpoint provides are zeroed: the padding of a vocabulary split."""

    param: nn.Parameter
    start: int = 0
    rows: int | None = None
    shard_dim: int | None = None
    shard_start: int = 0
    shard_size: int = 0
    full_size: int = 0

    def target(self) -> torch.Tensor:
        data = self.param.data
        return data if self.rows is None else data[self.start : self.start + self.rows]

    def shape(self) -> tuple[int, ...]:
        """The shape the checkpoint tensor must have."""
        shape = list(self.target().shape)
        if self.shard_dim is not None:
            shape[self.shard_dim] = self.full_size
        return tuple(shape)

    def read(self, source: torch.Tensor | TensorSource) -> torch.Tensor:
        if self.shard_dim is None:
            return source[:]
        index = [slice(None)] * (self.shard_dim + 1)
        index[self.shard_dim] = slice(self.shard_start, self.shard_start + self.shard_size)
        return source[tuple(index)]

    def load(self, source: torch.Tensor | TensorSource) -> None:
        target = self.target()
        part = self.read(source)
        if self.shard_dim is not None and part.shape[self.shard_dim] < target.shape[self.shard_dim]:
            target.zero_()
            target = target.narrow(self.shard_dim, 0, part.shape[self.shard_dim])
        target.copy_(part)
