"""Llama (and Mistral without its sliding window): GQA, RoPE, RMSNorm, SwiGLU."""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.models.attention import AttentionMetadata, PagedAttention
from pagedserve.server.models.base import CausalLM, KVCaches
from pagedserve.server.models.layers import GatedMLP, RMSNorm, RotaryEmbedding
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    qkv_parallel_linear,
)


class LlamaAttention(nn.Module):
    """This rank's query heads and KV head(s): QKV split by heads, o_proj by rows."""

    def __init__(
        self, config: ModelConfig, ops: KernelOps, qkv_bias: bool, o_bias: bool,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.head_dim = d = config.head_dim
        self.qkv_proj = qkv_parallel_linear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads,
            qkv_bias, group,
        )
        self.sizes = self.qkv_proj.output_sizes
        self.num_heads, self.num_kv_heads = self.sizes[0] // d, self.sizes[1] // d
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size,
                                        o_bias, group)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d**-0.5, ops)
        self.rotary_ = ops.rotary_

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        self.rotary_(qkv, self.num_heads + self.num_kv_heads, cos, sin)  # q and k, in place
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        out = self.attn(q, k, v, attn, kv_cache)  # [T, H, D]
        return self.o_proj(out.reshape(out.shape[0], -1))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, ops: KernelOps, qkv_bias: bool, o_bias: bool,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps, ops)
        self.self_attn = LlamaAttention(config, ops, qkv_bias, o_bias, group)
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
        self, config: ModelConfig, ops: KernelOps, qkv_bias: bool, o_bias: bool,
        group: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, ops, qkv_bias, o_bias, group)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.norm_eps, ops)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        attn: AttentionMetadata,
        kv_caches: KVCaches,
    ) -> torch.Tensor:  # [T, hidden]
        h = self.embed_tokens(input_ids)  # a fresh tensor: the residual stream adds into it
        cos, sin = self.rotary_emb(positions)  # [T, D/2] each
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, cos, sin, attn, kv_cache)
        return self.norm(h) if residual is None else self.norm.add_and_norm(h, residual)


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, kernel_ops: KernelOps,
                 group: TensorParallelGroup | None = None) -> None:
        super().__init__(config, kernel_ops, group)
        qkv_bias, o_bias = self.attention_biases(config)
        self.model = LlamaModel(config, kernel_ops, qkv_bias, o_bias, self.group)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.group)
        self.tie_embeddings(self.model.embed_tokens)

    @staticmethod
    def attention_biases(config: ModelConfig) -> tuple[bool, bool]:
        """(q/k/v bias, output-projection bias)."""
        bias = bool(config.hf_config.get("attention_bias", False))
        return bias, bias

    def map_checkpoint_name(self, name: str) -> str | None:
        # Older exports saved the rotary table; it is derived from the config here.
        return None if name.endswith("rotary_emb.inv_freq") else name
