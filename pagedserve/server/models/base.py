"""What every model family shares: the interface the runner calls and the loader's hooks.

``model(input_ids [T], positions [T], attn, kv_caches) -> hidden [T, hidden]`` runs the step's
packed tokens; ``compute_logits(hidden [N, hidden]) -> float32 [N, vocab]`` runs only on the
rows that sample. Callers run both under ``torch.inference_mode()``. Under tensor parallelism
every rank runs both on the same inputs; ``compute_logits`` returns None on ranks but 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.models.attention import AttentionMetadata
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import ParallelLMHead, VocabParallelEmbedding

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]
FusedTensors = Mapping[str, Sequence[tuple[str, int]]]


class CausalLM(nn.Module):
    """Base class of the families. Subclasses set ``self.model`` (the decoder stack, called
    with the step's inputs) and ``self.lm_head`` after ``super().__init__``. Module names
    follow the checkpoint's names, so most weights load by name. ``group`` is the
    tensor-parallel group this rank's shard belongs to (None: one rank holds everything)."""

    model: nn.Module
    lm_head: ParallelLMHead

    def __init__(self, config: ModelConfig, kernel_ops: KernelOps,
                 group: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.kernel_ops = kernel_ops
        self.group = group if group is not None else TensorParallelGroup()

    def tie_embeddings(self, embed_tokens: VocabParallelEmbedding) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_caches: KVCaches,
    ) -> torch.Tensor:
        if len(kv_caches) != self.config.num_hidden_layers:
            raise ValueError(
                f"got {len(kv_caches)} KV caches for {self.config.num_hidden_layers} layers"
            )
        if input_ids.shape != positions.shape or input_ids.shape[0] != attn.num_tokens:
            raise ValueError(
                f"input_ids {list(input_ids.shape)}, positions {list(positions.shape)} and "
                f"slot_mapping [{attn.num_tokens}] must all be [T]"
            )
        return self.model(input_ids, positions, attn, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head(hidden)

    def map_checkpoint_name(self, name: str) -> str | None:
        """The parameter a checkpoint tensor loads into, or None to skip it."""
        return name

    @staticmethod
    def fused_tensors(config: ModelConfig) -> FusedTensors:
        """The checkpoint projections this family stores stacked in one tensor: the fused
        module's name → (part name, rows) in stacking order. The loader splits such a tensor
        into its parts, which load as the separate projections' would."""
        return {}
