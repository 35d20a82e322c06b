"""Random ggml blocks of every block type, for types ``gguf`` cannot quantize to (the K and IQ4
types) and for codes no quantizer would choose (Q8_0's -128).

API:
- ``random_blocks(qtype, rows, inputs, seed, *, extreme=False, scale=(0.001, 0.01)) ->
  np.ndarray`` uint8 [rows, row bytes]: random bytes with every float16 scale (d, and dmin or
  m where the type has one) drawn from ``scale``, so that the weights stay in a sane range; with
  ``extreme``, a quarter of the blocks take float16's extremes instead (largest normal,
  smallest subnormal, negative, zero), none of them NaN or infinite.
- ``SCALE_OFFSETS``: type name -> byte offsets of each block's float16 scales.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCALE_OFFSETS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}
_EXTREMES = np.array([65504.0, 2.0**-24, -0.0123, 0.0, -65504.0, 6.1e-5], dtype=np.float16)


def random_blocks(qtype: Any, rows: int, inputs: int, seed: int, *, extreme: bool = False,
                  scale: tuple[float, float] = (0.001, 0.01)) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, inputs // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for offset in SCALE_OFFSETS[qtype.name]:
        scales = rng.uniform(*scale, blocks.shape[0]).astype(np.float16)
        if extreme:
            wild = rng.random(blocks.shape[0]) < 0.25
            scales[wild] = rng.choice(_EXTREMES, int(wild.sum()))
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw
