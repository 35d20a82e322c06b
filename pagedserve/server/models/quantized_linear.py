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
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_layers import PackableLinear

QUANTIZATIONS = ("none", "gguf", "int8", "int4")
# How a report names the embedding's table, beside the projections' kernels.
EMBEDDING_NOTE = "embedding "
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
        layers = ", ".join(name if name.startswith(EMBEDDING_NOTE) else
                           f"{name}: {n} projection{'s' if n > 1 else ''}"
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
    """Bytes of every parameter, packed or quantized projection and quantized embedding,
    each once (a tied embedding and head share theirs; packed weights may be views of one
    region, ``weight_arena.py``)."""
    tensors: list[torch.Tensor] = list(model.parameters())
    for module in model.modules():
        if isinstance(module, PackableLinear) and module.packed is not None:
            tensors += _packed_tensors(module)
        quantized = getattr(module, "quantized", None)
        if isinstance(quantized, QuantizedWeight):
            tensors += _parts(quantized)
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        key = (tensor.data_ptr() if not tensor.is_mkldnn else id(tensor), size)
        if key not in seen:
            seen.add(key)
            total += size
    return total


def _parts(weight: QuantizedWeight) -> list[torch.Tensor]:
    return [weight.qweight, weight.scales] + ([weight.mins] if weight.mins is not None else [])


def _packed_tensors(layer: PackableLinear) -> list[torch.Tensor]:
    packed = layer.packed
    if isinstance(packed, torch.Tensor):
        return [packed]
    if isinstance(packed, QuantizedWeight):
        return _parts(packed)
    # A kernel's own state: its tensor fields.
    return [getattr(packed, f) for f in getattr(packed, "__slots__", ())
            if isinstance(getattr(packed, f), torch.Tensor)]
