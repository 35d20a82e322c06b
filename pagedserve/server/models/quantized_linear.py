"""Weight-only quantization of a loaded model's projections (``--quantization``).

Every ``PackableLinear`` (QKV, output, gate/up, down and the LM head) of this rank, that is
its tensor-parallel shard, is quantized from the float weight just loaded and handed to the
kernel the backend's dispatch chooses for its format; the dense weight is released. The
layers' forward is unchanged: the engine never sees the format. Embeddings and norms stay
float.

- ``int8``: symmetric, one scale per output channel (the layout of torch's int8 CPU op).
- ``int4``: asymmetric, one scale and one min per group of 32 inputs (GGUF's Q4_1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedserve.kernels.quantized_linear import (
    QuantizedWeight,
    QuantKernel,
    choose_kernel,
    quantize_int4,
    quantize_int8,
)
from pagedserve.server.models.errors import ModelLoadError
from pagedserve.server.models.parallel_layers import PackableLinear

QUANTIZATIONS = ("none", "gguf", "int8", "int4")
INT4_GROUP_SIZE = 32


def check_quantization(name: str) -> None:
    if name not in QUANTIZATIONS:
        raise ModelLoadError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                             f"got {name!r}")


def quantize_weight(weight: torch.Tensor, scheme: str) -> QuantizedWeight:
    if scheme == "int8":
        return quantize_int8(weight)
    if scheme == "int4":
        return quantize_int4(weight, INT4_GROUP_SIZE)
    raise ModelLoadError(f"no weight-only quantization named {scheme!r}")


@dataclass(slots=True)
class QuantizationReport:
    """Which kernel runs how many projections, and the bytes the model's weights hold."""

    kernels: Counter[str] = field(default_factory=Counter)
    weight_bytes: int = 0

    def describe(self) -> str:
        layers = ", ".join(f"{name}: {n} projection{'s' if n > 1 else ''}"
                           for name, n in sorted(self.kernels.items()))
        return (f"{layers or 'no quantized projections'}; weights "
                f"{self.weight_bytes / 2**20:.1f} MiB in memory")


def quantize_linear_layers(model: nn.Module, scheme: str,
                           kernels: tuple[QuantKernel, ...]) -> Counter[str]:
    """Quantizes every still-dense projection of ``model`` with ``scheme``; returns how many
    layers each kernel runs."""
    chosen: Counter[str] = Counter()
    for layer in model.modules():
        if not isinstance(layer, PackableLinear) or layer.weight is None:
            continue
        weight = quantize_weight(layer.weight.detach().cpu(), scheme)
        kernel = choose_kernel(kernels, weight, layer.weight.device)
        layer.quantize(_to(weight, layer.weight.device), kernel)
        chosen[kernel.name] += 1
    return chosen


def _to(weight: QuantizedWeight, device: torch.device) -> QuantizedWeight:
    if device.type == "cpu":
        return weight
    return QuantizedWeight(weight.scheme, weight.out_features, weight.in_features,
                           weight.group_size, weight.qweight.to(device),
                           weight.scales.to(device),
                           None if weight.mins is None else weight.mins.to(device))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter (tied ones once) and every packed or quantized projection."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel() * param.element_size()
    for layer in model.modules():
        if isinstance(layer, PackableLinear) and layer.packed is not None:
            total += _packed_bytes(layer)
    return total


def _packed_bytes(layer: PackableLinear) -> int:
    if isinstance(layer.packing, QuantKernel):
        return layer.packing.state_nbytes(layer.packed)
    packed = layer.packed
    assert isinstance(packed, torch.Tensor)
    return packed.numel() * packed.element_size()
