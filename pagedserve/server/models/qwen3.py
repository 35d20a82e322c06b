"""Qwen3: the Llama layout with an RMSNorm over each query and key head before RoPE, no q/k/v
biases (unless the config asks for them), and a head size of its own (``head_dim``)."""

from __future__ import annotations

from pagedserve.server.models.llama import DecoderLayout, LlamaForCausalLM
from pagedserve.server.models.model_config import ModelConfig


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def layout(config: ModelConfig) -> DecoderLayout:
        bias = bool(config.hf_config.get("attention_bias", False))
        return DecoderLayout(qkv_bias=bias, o_bias=bias, qk_norm=True)
