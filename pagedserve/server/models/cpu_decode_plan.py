"""A decode-only step of a float32 Llama-layout model on the CPU's C kernels, as one flat run
of calls.

At one stream a decode step of a 1B model is about 15 ms, of which the modules' own Python
(``nn.Module`` calls, each op's checks, a fresh tensor for every output) took 1.5-1.9 ms: a
tenth of the step, in which no weight is read. The plan checks the step's tensors once and
then runs each layer as eight kernel calls into buffers allocated once for the step:

    norm (the residual add before it)  ->  QKV  ->  RoPE + KV write + attention (one call)
    ->  o_proj  ->  norm (the residual add before it)  ->  gate_up  ->  SiLU and mul  ->  down

These are the same kernels the modules call, with the same arguments and thread counts, so
the step's output is the same, bit for bit (tests/models/test_cpu_decode_plan.py).

A model takes the plan when every layer is the plain Llama layer (no biases, no per-head
norm), every projection runs the block-quant kernel, its norms, SiLU and attention are the C
ops, and it runs on one rank; a step takes it when it is decode only, with at most
``MLP_ROWS_PER_PASS`` sequences and the KV cache in a type the fused attention reads. Anything
else runs the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels import cpu_attention, cpu_block_quant, cpu_layer_ops
from pagedserve.kernels.cpu_attention import FusedDecodeStep
from pagedserve.kernels.cpu_block_quant import BlockQuantState, linear_into
from pagedserve.kernels.cpu_layer_ops import add_rms_norm_into, rms_norm_into, silu_and_mul_into
from pagedserve.server.models.attention import AttentionMetadata
from pagedserve.server.models.base import KVCaches
from pagedserve.server.models.layers import MLP_ROWS_PER_PASS, RMSNorm
from pagedserve.server.models.parallel_layers import PackableLinear


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor  # weights
    post_norm: torch.Tensor
    qkv: BlockQuantState
    o: BlockQuantState
    gate_up: BlockQuantState
    down: BlockQuantState


@dataclass(frozen=True, slots=True)
class CpuDecodePlan:
    layers: tuple[_Layer, ...]
    final_norm: torch.Tensor
    eps: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, model: torch.nn.Module, layer_type: type) -> CpuDecodePlan | None:
        """The plan of a ``LlamaModel`` (the decoder stack) whose layers are all of
        ``layer_type`` (the Llama layer, not a family's own), or None where one of its parts
        runs otherwise than the plan would."""
        layers = list(model.layers)
        if not layers or not _c_norm(model.norm):
            return None
        if any(type(layer) is not layer_type for layer in layers):
            return None
        attn, eps = layers[0].self_attn, model.norm.eps
        shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.attn.scale)
        planned = [_layer_plan(layer, shape, eps) for layer in layers]
        if any(layer is None for layer in planned):
            return None
        return cls(tuple(planned), model.norm.weight.detach(), eps, *shape)

    def runs(self, h: torch.Tensor, attn: AttentionMetadata, kv_caches: KVCaches) -> bool:
        """Whether this step's tensors are what the plan's calls take (the attention's own
        checks come in ``run``)."""
        if not (attn.is_decode_only and h.dtype is torch.float32 and h.is_cpu
                and h.dim() == 2 and h.is_contiguous() and 0 < h.shape[0] <= MLP_ROWS_PER_PASS
                and len(kv_caches) == len(self.layers)):
            return False
        key_cache = kv_caches[0][0]
        return all(cache.shape == key_cache.shape and cache.dtype is key_cache.dtype
                   and cache.is_contiguous() for pair in kv_caches for cache in pair)

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            attn: AttentionMetadata, kv_caches: KVCaches) -> torch.Tensor | None:
        """The final norm of the residual stream [T, hidden] after every layer, from the
        embeddings h [T, hidden] (which become the residual stream, added into in place);
        None, before anything is written, where the fused attention does not run these
        tensors."""
        rows, hidden = h.shape
        first = self.layers[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = torch.empty(rows, first.qkv.out_features)
        step = FusedDecodeStep.of(qkv, heads, kv_heads, cos, sin, *kv_caches[0],
                                  attn.slot_mapping, attn.block_tables, attn.seq_lens,
                                  self.scale)
        if step is None:
            return None
        x = torch.empty(rows, hidden)
        out = torch.empty(rows, heads * head_dim)
        o = torch.empty(rows, hidden)
        gate_up = torch.empty(rows, first.gate_up.out_features)
        act = torch.empty(rows, first.gate_up.out_features // 2)
        down = torch.empty(rows, hidden)
        residual, eps = h, self.eps
        rms_norm_into(residual, first.input_norm, eps, x)
        for i, (layer, (key_cache, value_cache)) in enumerate(zip(self.layers, kv_caches)):
            if i:
                add_rms_norm_into(down, residual, layer.input_norm, eps, x)
            linear_into(x, layer.qkv, qkv)
            step.run(qkv, key_cache, value_cache, out)
            linear_into(out, layer.o, o)
            add_rms_norm_into(o, residual, layer.post_norm, eps, x)
            linear_into(x, layer.gate_up, gate_up)
            silu_and_mul_into(gate_up, act)
            linear_into(act, layer.down, down)
        add_rms_norm_into(down, residual, self.final_norm, eps, x)
        return x


def _layer_plan(layer: torch.nn.Module, shape: tuple[int, int, int, float],
                eps: float) -> _Layer | None:
    """A Llama decoder layer's weights, where it runs the C kernels with the model's
    attention shape and norm epsilon, without biases or per-head norms."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if (attn.qk_norm or attn.attn.ops.rotary_cache_decode is not cpu_attention.rotary_cache_decode
            or (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.attn.scale) != shape
            or not all(_c_norm(norm) and norm.eps == eps for norm in norms)
            or mlp.silu_and_mul is not cpu_layer_ops.silu_and_mul):
        return None
    states = [_state(p) for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if any(state is None for state in states):
        return None
    return _Layer(norms[0].weight.detach(), norms[1].weight.detach(), *states)


def _c_norm(norm: RMSNorm) -> bool:
    """Whether a norm runs the C ops on a contiguous float32 weight."""
    return (norm.rms_norm is cpu_layer_ops.rms_norm
            and norm.add_rms_norm_ is cpu_layer_ops.add_rms_norm_
            and norm.weight.dtype is torch.float32 and norm.weight.is_cpu
            and norm.weight.is_contiguous())


def _state(projection: PackableLinear) -> BlockQuantState | None:
    """A projection's block-quant weight, where it has one and no bias (one rank's whole
    projection: a row-parallel one all-reduces on more ranks)."""
    state = projection.packed
    if (not isinstance(state, BlockQuantState) or projection.bias is not None
            or getattr(getattr(projection, "group", None), "world_size", 1) != 1
            or projection.packing is None
            or projection.packing.linear is not cpu_block_quant.BLOCK_QUANT_KERNEL.linear):
        return None
    return state
