"""Phi-3 (and Phi-3.5, Phi-4-mini's layout without partial RoPE): the Llama layout with the
query, key and value projections stored as one ``qkv_proj`` tensor and gate and up as one
``gate_up_proj`` (the loader splits them), and LongRoPE scaling (``layers.py``)."""

from __future__ import annotations

from pagedserve.server.models.base import FusedTensors
from pagedserve.server.models.llama import LlamaForCausalLM
from pagedserve.server.models.model_config import ModelConfig


class Phi3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def fused_tensors(config: ModelConfig) -> FusedTensors:
        q = config.num_attention_heads * config.head_dim
        kv = config.num_key_value_heads * config.head_dim
        return {
            "qkv_proj": (("q_proj", q), ("k_proj", kv), ("v_proj", kv)),
            "gate_up_proj": (("gate_proj", config.intermediate_size),
                             ("up_proj", config.intermediate_size)),
        }
