"""Qwen2: the Llama layout with biases on the q/k/v projections (none on the output)."""

from __future__ import annotations

from pagedserve.server.models.llama import LlamaForCausalLM
from pagedserve.server.models.model_config import ModelConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_biases(config: ModelConfig) -> tuple[bool, bool]:
        return True, False
