"""Qwen2: the Llama layout with biases on the q/k/v projections (none on the output)."""

from __future__ import annotations

from pagedserve.server.models.llama import DecoderLayout, LlamaForCausalLM
from pagedserve.server.models.model_config import ModelConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def layout(config: ModelConfig) -> DecoderLayout:
        return DecoderLayout(qkv_bias=True)
