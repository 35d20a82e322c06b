"""Llama (and Mistral without its sliding window): GQA, RoPE, RMSNorm, SwiGLU. The shared
decoder layer of the Llama-layout families, which declare what differs in a ``DecoderLayout``
(``qwen2.py``, ``qwen3.py``, ``phi3.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.models.attention import AttentionMetadata, PagedAttention
from pagedserve.server.models.base import CausalLM, KVCaches
from pagedserve.server.models.cpu_decode_plan import CpuDecodePlan
from pagedserve.server.models.layers import GatedMLP, RMSNorm, RotaryEmbedding
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    qkv_parallel_linear,
)


@dataclass(frozen=True, slots=True)
class DecoderLayout:
    """What a Llama-layout family changes on the shared decoder layer."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # an RMSNorm over each query and key head before RoPE (Qwen3)


class LlamaAttention(nn.Module):
    """This rank's query heads and KV head(s): QKV split by heads, o_proj by rows."""

    def __init__(
        self, config: ModelConfig, ops: KernelOps, layout: DecoderLayout,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.head_dim = d = config.head_dim
        self.qkv_proj = qkv_parallel_linear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads,
            layout.qkv_bias, group,
        )
        self.sizes = self.qkv_proj.output_sizes
        self.num_heads, self.num_kv_heads = self.sizes[0] // d, self.sizes[1] // d
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size,
                                        layout.o_bias, group)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d**-0.5, ops)
        self.rotary_ = ops.rotary_
        self.qk_norm = layout.qk_norm
        if layout.qk_norm:
            self.q_norm = RMSNorm(d, config.norm_eps, ops)
            self.k_norm = RMSNorm(d, config.norm_eps, ops)

    def _norm_heads_(self, qkv: torch.Tensor) -> None:
        """Normalises each query and key head of qkv [T, (H + 2 Hkv) D] in place."""
        q_end = self.sizes[0]
        k_end = q_end + self.sizes[1]
        for rows, norm in ((qkv[:, :q_end], self.q_norm), (qkv[:, q_end:k_end], self.k_norm)):
            rows.copy_(norm(rows.reshape(-1, self.head_dim)).view(rows.shape))

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        if self.qk_norm:
            self._norm_heads_(qkv)
        out = self.attn.decode_from_qkv(qkv, cos, sin, attn, kv_cache)  # [T, H, D] or None
        if out is None:
            self.rotary_(qkv, self.num_heads + self.num_kv_heads, cos, sin)  # q, k in place
            q, k, v = qkv.split(self.sizes, dim=-1)
            q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
            k = k.view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
            v = v.view(-1, self.num_kv_heads, self.head_dim)
            out = self.attn(q, k, v, attn, kv_cache)
        return self.o_proj(out.reshape(out.shape[0], -1))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, ops: KernelOps, layout: DecoderLayout,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps, ops)
        self.self_attn = LlamaAttention(config, ops, layout, group)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps, ops)
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act,
            bias=bool(config.hf_config.get("mlp_bias", False)), group=group, ops=ops,
        )

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]: the last layer's MLP output, or the embedding
        residual: torch.Tensor | None,  # the residual stream before h is added; None at first
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLP output, residual stream before it is added). Each residual add runs with the
        norm after it, as one op (vLLM's fused add-and-norm): the next layer's first norm, or
        the model's last, adds this MLP output into the stream."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h = self.input_layernorm.add_and_norm(h, residual)
        h = self.self_attn(h, cos, sin, attn, kv_cache)
        h = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(
        self, config: ModelConfig, ops: KernelOps, layout: DecoderLayout,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, ops, layout, group)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.norm_eps, ops)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        # A decode-only step's flat run of C calls (cpu_decode_plan.py): None until the first
        # step, then the plan, or False where the model's parts run otherwise.
        self.decode_plan: CpuDecodePlan | bool | None = None

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        attn: AttentionMetadata,
        kv_caches: KVCaches,
    ) -> torch.Tensor:  # [T, hidden]
        h = self.embed_tokens(input_ids)  # a fresh tensor: the residual stream adds into it
        cos, sin = self.rotary_emb(positions)  # [T, D/2] each
        if self.decode_plan is None:  # built at the first step, once the weights are packed
            self.decode_plan = CpuDecodePlan.of(self, LlamaDecoderLayer) or False
        if self.decode_plan and self.decode_plan.runs(h, attn, kv_caches):
            out = self.decode_plan.run(h, cos, sin, attn, kv_caches)
            if out is not None:
                return out
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, cos, sin, attn, kv_cache)
        return self.norm(h) if residual is None else self.norm.add_and_norm(h, residual)


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, kernel_ops: KernelOps,
                 group: TensorParallelGroup | None = None) -> None:
        super().__init__(config, kernel_ops, group)
        self.model = LlamaModel(config, kernel_ops, self.layout(config), self.group)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.group)
        self.tie_embeddings(self.model.embed_tokens)

    @staticmethod
    def layout(config: ModelConfig) -> DecoderLayout:
        bias = bool(config.hf_config.get("attention_bias", False))
        return DecoderLayout(qkv_bias=bias, o_bias=bias)

    def map_checkpoint_name(self, name: str) -> str | None:
        # Older exports saved the rotary table; it is derived from the config here.
        return None if name.endswith("rotary_emb.inv_freq") else name
