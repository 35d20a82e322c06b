"""The element-wise ops between a decoder layer's GEMMs: the torch reference of each.

A backend may replace them (``KernelOps.rms_norm``, ``add_rms_norm_``, ``silu_and_mul``,
``rotary_``); these are
what every replacement is tested against, and what runs on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension; x [T, hidden].

    The variance in float32, as the reference implementations do: bfloat16 squares lose
    precision long before they overflow range.
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """A decoder layer's residual add and the norm after it: ``residual += x`` in place, then
    :func:`rms_norm` of the sum; x and residual [T, hidden]."""
    residual.add_(x)
    return rms_norm(residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for x = [gate | up], [T, 2 d] -> [T, d]: SwiGLU's gating."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates, in place, the first ``heads`` head vectors of each row of x [T, >= heads * D]
    (GPT-NeoX / Hugging Face halves) by cos/sin [T, D/2] (float32)."""
    half = cos.shape[-1]
    view = x[:, : heads * 2 * half].unflatten(-1, (heads, 2 * half))  # [T, heads, D]
    x1, x2 = view[..., :half], view[..., half:]
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    view.copy_(rotated)
