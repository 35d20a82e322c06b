"""Building blocks shared by the model families: norms, rotary embedding, the gated MLP and
activations. The projections themselves are in ``parallel_layers``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import (
    MergedColumnParallelLinear,
    RowParallelLinear,
)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ModelLoadError(
            f"unsupported activation {name!r}; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """RMSNorm through the backend's op (the torch reference: ``kernels/layer_ops.py``);
    ``add_and_norm`` takes the residual add before it along, as one op."""

    def __init__(self, hidden_size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.rms_norm = ops.rms_norm
        self.add_rms_norm_ = ops.add_rms_norm_

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden]
        return self.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` (in place), then the norm of the sum."""
        return self.add_rms_norm_(x, residual, self.weight, self.eps)


# Rows of a long prefill that a CPU runs through the MLP at a time: the [T, 2 I] intermediate
# of 2,048 tokens of a 1B model is 128 MiB, fresh pages every layer (the allocator maps a block
# that large anew each time and the first write faults every page in); 256 rows take 16 MiB,
# which the allocator keeps and hands back. The block-quant kernel computes each row apart
# from the others, so its outputs do not change.
MLP_ROWS_PER_PASS = 256


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU when the activation is SiLU. gate and up are split
    across ranks by columns, down by rows (one all-reduce)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool,
                 group: TensorParallelGroup, ops: KernelOps) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear.even(
            hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size}, bias,
            group,
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, group)
        self.act = get_activation(act)
        # SiLU's gating is one fused op of the backend; other activations stay two ops.
        self.silu_and_mul = ops.silu_and_mul if self.act is F.silu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= MLP_ROWS_PER_PASS or x.device.type != "cpu":
            return self._forward(x)
        return torch.cat([self._forward(rows) for rows in x.split(MLP_ROWS_PER_PASS)])

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 I]
        if self.silu_and_mul is not None:
            return self.down_proj(self.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


def rope_inv_freq(
    head_dim: int, theta: float, scaling: Mapping[str, Any] | None
) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], float32, with the checkpoint's scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "longrope":
        # The short factors: the engine stops at the original context (ModelConfig).
        return 1.0 / (_factors(scaling, "short_factor", inv_freq) * theta**exponents)
    if "frequency_factors" in scaling:
        # A GGUF file's llama3 scaling: llama.cpp's converter stores each frequency's divisor.
        return inv_freq / _factors(scaling, "frequency_factors", inv_freq)
    factor = float(_rope_param(scaling, "factor"))
    if kind == "linear":
        return inv_freq / factor
    return _llama3_inv_freq(inv_freq, factor, scaling)


def rope_attention_scaling(scaling: Mapping[str, Any] | None) -> float:
    """The factor LongRoPE multiplies cos and sin by (1 for the other kinds)."""
    if scaling is None or scaling["rope_type"] != "longrope":
        return 1.0
    return float(scaling.get("attention_factor", 1.0))


def _factors(scaling: Mapping[str, Any], key: str, inv_freq: torch.Tensor) -> torch.Tensor:
    factors = torch.tensor(_rope_param(scaling, key), dtype=torch.float32, device="cpu")
    if factors.shape != inv_freq.shape:
        raise ModelLoadError(
            f"rope_scaling {key!r} has {factors.numel()} values; the head dimension has "
            f"{inv_freq.numel()} frequencies"
        )
    return factors


def _rope_param(scaling: Mapping[str, Any], key: str) -> Any:
    if key not in scaling:
        raise ModelLoadError(f"rope_scaling of type {scaling['rope_type']!r} needs {key!r}")
    return scaling[key]


def _llama3_inv_freq(
    inv_freq: torch.Tensor, factor: float, scaling: Mapping[str, Any]
) -> torch.Tensor:
    # Llama 3.1 keeps high frequencies (short wavelengths), divides low ones by `factor`, and
    # interpolates smoothly between the two wavelength bounds.
    low = float(_rope_param(scaling, "low_freq_factor"))
    high = float(_rope_param(scaling, "high_freq_factor"))
    original = float(_rope_param(scaling, "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, interpolated)
    return torch.where(wavelen < original / high, inv_freq, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions, computed once per forward and shared by all
    layers."""

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> None:
        super().__init__()
        # Created on the CPU explicitly so that a model built on the meta device keeps real
        # frequencies; the loader moves buffers to the target device.
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self.attention_scaling = rope_attention_scaling(scaling)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        if self.attention_scaling == 1.0:
            return freqs.cos(), freqs.sin()
        return freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
