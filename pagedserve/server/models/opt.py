"""OPT, the PagedAttention paper's family: learned positions, LayerNorm, ReLU MLP, biases.

Variants read from config.json: ``do_layer_norm_before`` (False for opt-350m: post-norm),
``word_embed_proj_dim`` (embeddings narrower than the hidden size, with project_in/out),
``enable_bias``, ``layer_norm_elementwise_affine`` and ``_remove_final_layer_norm``.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.models.attention import AttentionMetadata, PagedAttention
from pagedserve.server.models.base import CausalLM, KVCaches
from pagedserve.server.models.layers import get_activation
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    qkv_parallel_linear,
)

# OPT's position table starts 2 rows in (rows 0-1 were reserved for padding in fairseq).
POSITION_OFFSET = 2


def _layer_norm(config: ModelConfig, size: int) -> nn.LayerNorm:
    affine = bool(config.hf_config.get("layer_norm_elementwise_affine", True))
    return nn.LayerNorm(size, eps=config.norm_eps, elementwise_affine=affine)


class OPTAttention(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, bias: bool,
                 group: TensorParallelGroup) -> None:
        super().__init__()
        heads = config.num_attention_heads
        self.head_dim = d = config.head_dim
        self.qkv_proj = qkv_parallel_linear(config.hidden_size, d, heads, heads, bias, group)
        self.num_heads = self.qkv_proj.output_sizes[0] // d  # this rank's heads
        self.out_proj = RowParallelLinear(heads * d, config.hidden_size, bias, group)
        self.attn = PagedAttention(self.num_heads, self.num_heads, d, d**-0.5, ops)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        q, k, v = (t.view(-1, self.num_heads, self.head_dim) for t in self.qkv_proj(x).chunk(3, -1))
        out = self.attn(q, k, v, attn, kv_cache)  # [T, H, D]
        return self.out_proj(out.reshape(out.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, group: TensorParallelGroup) -> None:
        super().__init__()
        bias = bool(config.hf_config.get("enable_bias", True))
        self.pre_norm = bool(config.hf_config.get("do_layer_norm_before", True))
        self.self_attn = OPTAttention(config, ops, bias, group)
        self.self_attn_layer_norm = _layer_norm(config, config.hidden_size)
        hidden, ffn = config.hidden_size, config.intermediate_size
        self.fc1 = ColumnParallelLinear(hidden, ffn, bias, group)
        self.fc2 = RowParallelLinear(ffn, hidden, bias, group)
        self.final_layer_norm = _layer_norm(config, config.hidden_size)
        self.act = get_activation(config.hidden_act)

    def forward(
        self,
        h: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        # Pre-norm normalises each block's input; post-norm (opt-350m) its residual sum.
        x = self.self_attn_layer_norm(h) if self.pre_norm else h
        h = h + self.self_attn(x, attn, kv_cache)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        x = self.final_layer_norm(h) if self.pre_norm else h
        h = h + self.fc2(self.act(self.fc1(x)))
        return h if self.pre_norm else self.final_layer_norm(h)


class OPTDecoder(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, group: TensorParallelGroup) -> None:
        super().__init__()
        hidden = config.hidden_size
        embed_dim = int(config.hf_config.get("word_embed_proj_dim") or hidden)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, embed_dim, group)
        # Positions and the projections are small: every rank holds all of them.
        self.embed_positions = nn.Embedding(
            config.max_position_embeddings + POSITION_OFFSET, hidden
        )
        self.project_in = nn.Linear(embed_dim, hidden, bias=False) if embed_dim != hidden else None
        self.project_out = nn.Linear(hidden, embed_dim, bias=False) if embed_dim != hidden else None
        self.layers = nn.ModuleList(
            OPTDecoderLayer(config, ops, group) for _ in range(config.num_hidden_layers)
        )
        keep_final = config.hf_config.get("do_layer_norm_before", True) and not (
            config.hf_config.get("_remove_final_layer_norm", False)
        )
        self.final_layer_norm = _layer_norm(config, hidden) if keep_final else None

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        attn: AttentionMetadata,
        kv_caches: KVCaches,
    ) -> torch.Tensor:  # [T, hidden]
        h = self.embed_tokens(input_ids)
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, attn, kv_cache)
        return self.final_layer_norm(h) if self.final_layer_norm is not None else h


class OPTModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, group: TensorParallelGroup) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config, ops, group)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_caches: KVCaches,
    ) -> torch.Tensor:
        return self.decoder(input_ids, positions, attn, kv_caches)


class OPTForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, kernel_ops: KernelOps,
                 group: TensorParallelGroup | None = None) -> None:
        super().__init__(config, kernel_ops, group)
        self.model = OPTModel(config, kernel_ops, self.group)
        embed_tokens = self.model.decoder.embed_tokens
        self.lm_head = ParallelLMHead(config.vocab_size, embed_tokens.embedding_dim, self.group)
        self.tie_embeddings(embed_tokens)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        # project_out runs here, on the sampled rows only, rather than on every step token.
        project_out = self.model.decoder.project_out
        if project_out is not None:
            hidden = project_out(hidden)
        return super().compute_logits(hidden)

    def map_checkpoint_name(self, name: str) -> str | None:
        # facebook/opt-* safetensors name the decoder without the "model." prefix.
        return "model." + name if name.startswith("decoder.") else name
