"""GGUF quantized blocks → ``QuantizedWeight``, exactly (every weight dequantizes to the value
``gguf.quants.dequantize`` gives), once at load: the form torch's int4 / int8 ops take, for a
machine where the C block-quant kernel (which reads every block type as stored) is not built
or steps aside.

Block layouts (ggml's), one row of ``in / block`` blocks per output row:

- Q8_0, 34 bytes per 32: float16 ``d``, 32 int8 ``q``; ``w = d * q`` → int8, groups of 32.
- Q4_0, 18 bytes per 32: ``d``, 16 bytes of nibbles, element ``j`` in the low nibble of byte
  ``j`` and element ``j + 16`` in its high nibble; ``w = d * (q - 8)`` → int4, min ``-8 d``.
- Q4_1, 20 bytes per 32: ``d``, ``m``, nibbles as Q4_0; ``w = d * q + m`` → int4.
- Q4_K, 144 bytes per 256: ``d``, ``dmin``, 12 bytes packing eight 6-bit scales and mins,
  128 bytes of nibbles (each 64 elements: 32 bytes, low nibbles first then high);
  ``w = d * sc_j * q - dmin * m_j`` per sub-block ``j`` of 32 → int4, groups of 32.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedserve.kernels.quantized_linear import (
    QuantizationError,
    QuantizedWeight,
    pack_nibbles,
)

# ggml's type ids (gguf.GGMLQuantizationType), so that this module needs no gguf import.
Q4_0, Q4_1, Q8_0, Q4_K = 2, 3, 8, 12
# type id → (name, elements per block, bytes per block)
BLOCKS = {Q4_0: ("Q4_0", 32, 18), Q4_1: ("Q4_1", 32, 20), Q8_0: ("Q8_0", 32, 34),
          Q4_K: ("Q4_K", 256, 144)}
GROUP_SIZE = 32


def can_repack(type_id: int) -> bool:
    return type_id in BLOCKS


def repack(type_id: int, raw: np.ndarray | torch.Tensor,
           shape: tuple[int, int]) -> QuantizedWeight:
    """The weight of Hugging Face shape ``shape`` ([out, in]) stored as ``raw`` blocks of
    ggml type ``type_id``; QuantizationError when the bytes do not fit the shape and type."""
    if type_id not in BLOCKS:
        raise QuantizationError(f"no repack for ggml type {type_id}")
    name, block, nbytes = BLOCKS[type_id]
    out, inp = shape
    if inp % block:
        raise QuantizationError(f"{name} tensor of shape [{out}, {inp}]: {inp} inputs are not a "
                                f"whole number of its blocks of {block}")
    data = torch.from_numpy(np.array(raw, copy=True)).view(torch.uint8)  # a writable copy
    want = out * (inp // block) * nbytes
    if data.numel() != want:
        raise QuantizationError(f"{name} tensor of shape [{out}, {inp}] needs {want} bytes, "
                                f"got {data.numel()}")
    blocks = data.reshape(out, inp // block, nbytes)
    return {Q8_0: _q8_0, Q4_0: _q4_0, Q4_1: _q4_1, Q4_K: _q4_k}[type_id](blocks, out, inp)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte ``start`` of every block, as float32 [out, blocks]."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16)[..., 0].float()


def _q8_0(blocks: torch.Tensor, out: int, inp: int) -> QuantizedWeight:
    codes = blocks[..., 2:].contiguous().view(torch.int8).reshape(out, inp)
    return QuantizedWeight("int8", out, inp, GROUP_SIZE, codes, _f16(blocks, 0))


def _split_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes → [..., 32] codes: the low nibbles, then the high ones."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _q4_0(blocks: torch.Tensor, out: int, inp: int) -> QuantizedWeight:
    d = _f16(blocks, 0)
    codes = _split_nibbles(blocks[..., 2:]).reshape(out, inp)
    return QuantizedWeight("int4", out, inp, GROUP_SIZE, pack_nibbles(codes), d, -8 * d)


def _q4_1(blocks: torch.Tensor, out: int, inp: int) -> QuantizedWeight:
    codes = _split_nibbles(blocks[..., 4:]).reshape(out, inp)
    return QuantizedWeight("int4", out, inp, GROUP_SIZE, pack_nibbles(codes), _f16(blocks, 0),
                           _f16(blocks, 2))


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes → eight 6-bit scales and eight 6-bit mins ([..., 8] each, int32)."""
    b = packed.to(torch.int32)
    low_sc, low_m, high = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    scales = torch.cat([low_sc & 63, (high & 15) | ((low_sc >> 6) << 4)], dim=-1)
    mins = torch.cat([low_m & 63, (high >> 4) | ((low_m >> 6) << 4)], dim=-1)
    return scales, mins


def _q4_k(blocks: torch.Tensor, out: int, inp: int) -> QuantizedWeight:
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = _k_scales_mins(blocks[..., 4:16])
    qs = blocks[..., 16:].reshape(out, -1, 4, 32)  # four chunks of 64 elements
    codes = torch.stack([qs & 15, qs >> 4], dim=3).reshape(out, inp)
    scales = (d[..., None] * sc).reshape(out, -1)
    mins = -(dmin[..., None] * m).reshape(out, -1)
    return QuantizedWeight("int4", out, inp, GROUP_SIZE, pack_nibbles(codes), scales, mins)
