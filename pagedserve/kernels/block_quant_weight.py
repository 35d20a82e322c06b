"""A linear weight as a GGUF file stores it: row segments of ggml blocks, each of one type, so
that a fused projection (QKV with V in Q6_K and Q/K in Q4_K) stays one weight.

Row selection (a tensor-parallel shard, llama.cpp's rope permutation of Q and K), an input
shard on whole blocks, zero padding rows and row concatenation all work on the raw rows
before any kernel packs them; ``dequantize_blocks`` is the reference (``gguf``'s own
dequantization). ``from_quantized`` writes a ``QuantizedWeight`` in groups of 32 with float16
scales (GGUF's Q4_1 / Q8_0 rule) as Q4_1 / Q8_0 blocks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.kernels.quantized_linear import (
    QuantizationError,
    QuantizedWeight,
    unpack_nibbles,
)

# ggml type id -> (name, inputs per block, bytes per block): the GGUF types a block weight
# may hold (the kernels' own table in csrc/bq_layout.h agrees; tests check it).
GGUF_BLOCKS = {
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
}
Q4_1, Q8_0 = 3, 8


@dataclass(frozen=True, slots=True)
class BlockSegment:
    """``raw``: uint8 [rows, row bytes], each row the ggml blocks of one output row."""

    type_id: int
    raw: torch.Tensor

    @property
    def name(self) -> str:
        return GGUF_BLOCKS[self.type_id][0]

    @property
    def rows(self) -> int:
        return self.raw.shape[0]

    @property
    def padded_in(self) -> int:
        _, block, nbytes = GGUF_BLOCKS[self.type_id]
        return self.raw.shape[1] // nbytes * block


@dataclass(frozen=True, slots=True)
class BlockQuantWeight:
    """A weight [out_features, in_features]: its segments' rows stacked in order. The blocks
    may cover more inputs than ``in_features`` (zero codes past it)."""

    segments: tuple[BlockSegment, ...]
    in_features: int

    def __post_init__(self) -> None:
        if not self.segments:
            raise QuantizationError("a block weight needs at least one segment")
        widths = {s.padded_in for s in self.segments}
        for s in self.segments:
            if s.type_id not in GGUF_BLOCKS or s.raw.dtype != torch.uint8 or s.raw.dim() != 2:
                raise QuantizationError(f"segment of type {s.type_id} must be a 2-D uint8 "
                                        f"tensor of a known GGUF type")
        if len(widths) != 1 or widths.pop() < self.in_features:
            covered = sorted(s.padded_in for s in self.segments)
            raise QuantizationError(f"segments covering {covered} inputs do not make one "
                                    f"weight of {self.in_features}")

    @property
    def out_features(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def padded_in_features(self) -> int:
        return self.segments[0].padded_in

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.name for s in self.segments))

    def nbytes(self) -> int:
        return sum(s.raw.numel() for s in self.segments)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_blocks(self, dtype)


def from_gguf(type_id: int, raw: np.ndarray | torch.Tensor,
              shape: tuple[int, int]) -> BlockQuantWeight:
    """The weight of Hugging Face shape ``shape`` ([out, in]) stored as ``raw`` blocks of ggml
    type ``type_id``, without a copy; QuantizationError when the bytes do not fit."""
    if type_id not in GGUF_BLOCKS:
        raise QuantizationError(f"no block layout for ggml type {type_id}")
    name, block, nbytes = GGUF_BLOCKS[type_id]
    out, inp = shape
    if inp % block:
        raise QuantizationError(f"{name} tensor of shape [{out}, {inp}]: {inp} inputs are not a "
                                f"whole number of its blocks of {block}")
    data = raw if isinstance(raw, torch.Tensor) else _as_tensor(raw)
    want = out * (inp // block) * nbytes
    if data.numel() * data.element_size() != want:
        raise QuantizationError(f"{name} tensor of shape [{out}, {inp}] needs {want} bytes, "
                                f"got {data.numel() * data.element_size()}")
    rows = data.contiguous().view(torch.uint8).reshape(out, want // out)
    return BlockQuantWeight((BlockSegment(type_id, rows),), inp)


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A read-only memory map as a tensor, without a copy: nothing writes to it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(array))


def take_rows(weight: BlockQuantWeight, rows: torch.Tensor | slice) -> BlockQuantWeight:
    """Output rows ``rows`` of a one-segment weight (a checkpoint tensor)."""
    if len(weight.segments) != 1:
        raise QuantizationError("rows are taken from one checkpoint tensor at a time")
    (seg,) = weight.segments
    return BlockQuantWeight((BlockSegment(seg.type_id, seg.raw[rows]),), weight.in_features)


def take_inputs(weight: BlockQuantWeight, start: int, size: int) -> BlockQuantWeight:
    """Inputs ``[start, start + size)``, whole blocks of every segment's type (a row-parallel
    rank's shard); QuantizationError otherwise."""
    parts = []
    for seg in weight.segments:
        name, block, nbytes = GGUF_BLOCKS[seg.type_id]
        if start % block or size % block or start + size > weight.in_features:
            raise QuantizationError(f"inputs [{start}, {start + size}) of a weight with "
                                    f"{weight.in_features} inputs are not whole {name} blocks "
                                    f"of {block}")
        cols = slice(start // block * nbytes, (start + size) // block * nbytes)
        parts.append(BlockSegment(seg.type_id, seg.raw[:, cols]))
    return BlockQuantWeight(tuple(parts), size)


def pad_rows(weight: BlockQuantWeight, rows: int) -> BlockQuantWeight:
    """``weight`` with zero rows (zero blocks: weights of 0 in every type) up to ``rows``."""
    extra = rows - weight.out_features
    if extra <= 0:
        return weight
    last = weight.segments[-1]
    padded = torch.cat([last.raw, last.raw.new_zeros(extra, last.raw.shape[1])])
    return BlockQuantWeight((*weight.segments[:-1], BlockSegment(last.type_id, padded)),
                            weight.in_features)


def concat_rows(parts: list[BlockQuantWeight]) -> BlockQuantWeight:
    """Weights of one input size stacked along the output dim (a fused QKV or gate/up), each
    keeping its own type."""
    first = parts[0]
    for part in parts[1:]:
        if (part.in_features, part.padded_in_features) != (first.in_features,
                                                           first.padded_in_features):
            raise QuantizationError(f"cannot stack a weight of {part.in_features} inputs under "
                                    f"one of {first.in_features}")
    return BlockQuantWeight(tuple(s for p in parts for s in p.segments), first.in_features)


def dequantize_blocks(weight: BlockQuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [out, in], as ``gguf.quants.dequantize`` reads the blocks."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = [torch.from_numpy(np.asarray(dequantize(s.raw.numpy(),
                                                   GGMLQuantizationType(s.type_id)),
                                        dtype=np.float32).reshape(s.rows, -1).copy())
            for s in weight.segments]
    return torch.cat(rows)[:, : weight.in_features].to(dtype).contiguous()


def _is_float16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.half().float(), t))


def from_quantized(qw: QuantizedWeight) -> BlockQuantWeight | None:
    """``qw`` as Q4_1 (int4) or Q8_0 (int8) blocks, where its groups are 32 inputs and its
    scales (and mins) float16 values; None otherwise."""
    if qw.group_size != 32 or not _is_float16(qw.scales):
        return None
    n, blocks = qw.out_features, qw.num_groups
    d = qw.scales.half().view(torch.uint8).reshape(n, blocks, 2)
    if qw.scheme == "int8":
        body = [d, qw.qweight.view(torch.uint8).reshape(n, blocks, 32)]
        type_id = Q8_0
    else:
        if qw.mins is None or not _is_float16(qw.mins):
            return None
        codes = unpack_nibbles(qw.qweight).reshape(n, blocks, 32)
        nibbles = codes[..., :16] | (codes[..., 16:] << 4)
        body = [d, qw.mins.half().view(torch.uint8).reshape(n, blocks, 2), nibbles]
        type_id = Q4_1
    raw = torch.cat(body, dim=-1).reshape(n, -1)
    return BlockQuantWeight((BlockSegment(type_id, raw),), qw.in_features)
