"""``--quantization gguf``: a GGUF file's quantized projections run as stored.

After the float load (which checked every tensor's name and shape), each projection whose
checkpoint tensors are all of a type ``gguf_repack`` reads is rebuilt from the file's raw
blocks, in the Hugging Face row order, cut to this rank's tensor-parallel shard and stacked as
the layer packs them (QKV, gate/up), then handed to the kernel the dispatch chooses. A
projection stays float (dequantized) when a tensor is of another type, when its parts differ
in format, when a row-parallel shard does not fall on whole groups, or when no kernel of the
backend runs its format (the reference would dequantize on every call). A tied LM head reads
the embedding's blocks. The embedding itself stays float.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from pagedserve.kernels.quantized_linear import (
    REFERENCE,
    QuantizationError,
    QuantizedTable,
    QuantizedWeight,
    QuantKernel,
    choose_kernel,
    concat_rows,
    dequantize,
    pad_rows,
    quantize_int8,
    take_inputs,
    take_rows,
)
from pagedserve.server.models.gguf_repack import BLOCKS, can_repack, repack
from pagedserve.server.models.gguf_weights import GGUFTensor, gguf_tensors
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_layers import PackableLinear, VocabParallelEmbedding
from pagedserve.server.models.quantized_linear import EMBEDDING_NOTE
from pagedserve.server.models.source import open_gguf_model
from pagedserve.server.models.weight_slot import WeightSlot

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


class _StaysFloat(Exception):
    """Why a projection keeps its dequantized weight."""


def keep_gguf_types(model: nn.Module, path: Path, config: ModelConfig,
                    kernels: tuple[QuantKernel, ...]) -> Counter[str]:
    """Runs every projection of ``model`` that the file stores in a repackable type on its
    kernel; returns how many projections each kernel runs and why the others stay float."""
    tensors = {t.name: t for t in gguf_tensors(open_gguf_model(path), config)}
    if config.tie_word_embeddings and LM_HEAD not in tensors and EMBEDDING in tensors:
        tensors[LM_HEAD] = tensors[EMBEDDING]
    counts: Counter[str] = Counter()
    head: tuple[QuantizedWeight, QuantKernel, PackableLinear] | None = None
    for prefix, layer in model.named_modules():
        if not isinstance(layer, PackableLinear) or layer.weight is None:
            continue
        device = layer.weight.device
        try:
            weight = _layer_weight(layer, prefix, tensors, kernels, device)
            kernel = choose_kernel(kernels, weight, device)
            if kernel is REFERENCE:
                raise _StaysFloat(f"no kernel for {weight.scheme} in groups of "
                                  f"{weight.group_size}")
        except _StaysFloat as reason:
            counts[f"float ({reason})"] += 1
            continue
        layer.quantize(weight, kernel)
        rescaled = weight.scheme == "int8" and weight.num_groups == 1
        counts[kernel.name + (" (int8 groups rescaled per channel)" if rescaled else "")] += 1
        if prefix.endswith("lm_head"):
            head = (weight, kernel, layer)
    embedding = _embedding(model)
    if embedding is not None and kernels:
        counts.update(_quantize_embedding(embedding, tensors, head,
                                          config.tie_word_embeddings))
    return counts


def _rescaled(weight: QuantizedWeight, kernels: tuple[QuantKernel, ...],
              device: torch.device) -> QuantizedWeight:
    """``weight``, or where no kernel runs int8 in groups but one runs it per channel, the
    same weight with one scale per output row. The whole tensor is rescaled before any
    tensor-parallel split, so that every rank's shard has the scales of one rank's."""
    if weight.scheme != "int8" or weight.num_groups == 1:
        return weight
    if choose_kernel(kernels, weight, device) is not REFERENCE:
        return weight
    rescaled = quantize_int8(dequantize(weight))
    return rescaled if choose_kernel(kernels, rescaled, device) is not REFERENCE else weight


def _embedding(model: nn.Module) -> VocabParallelEmbedding | None:
    found = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding)]
    return found[0] if len(found) == 1 else None


def _quantize_embedding(embedding: VocabParallelEmbedding, tensors: Mapping[str, GGUFTensor],
                        head: tuple[QuantizedWeight, QuantKernel, PackableLinear] | None,
                        tied: bool) -> Counter[str]:
    """Looks the embedding's rows up in quantized codes: the LM head's when the two are tied
    (the table is no longer held float by either), else the file's own blocks."""
    if tied:
        if head is None:
            return Counter()
        weight, kernel, layer = head
        if kernel.lookup is None:
            embedding.quantize(weight)
        else:
            embedding.quantize(QuantizedTable(layer.packed, kernel.lookup, weight.out_features,
                                              weight.in_features))
        return Counter({f"{EMBEDDING_NOTE}looked up in the LM head's codes": 1})
    try:
        [(name, slot)] = embedding.checkpoint_slots(EMBEDDING.rpartition(".")[0], "weight")
        tensor = tensors.get(name)
        if tensor is None:
            return Counter()
        embedding.quantize(_shard(_repacked(tensor), slot))
    except _StaysFloat:
        return Counter()
    return Counter({f"{EMBEDDING_NOTE}looked up in {tensor.tensor_type.name} blocks": 1})


def _layer_weight(layer: PackableLinear, prefix: str, tensors: Mapping[str, GGUFTensor],
                  kernels: tuple[QuantKernel, ...], device: torch.device) -> QuantizedWeight:
    parts = []
    for name, slot in layer.checkpoint_slots(prefix, "weight"):
        tensor = tensors.get(name)
        if tensor is None:
            raise _StaysFloat(f"no tensor {name}")
        parts.append(_shard(_rescaled(_repacked(tensor), kernels, device), slot))
    try:
        return concat_rows(parts)
    except QuantizationError as exc:
        raise _StaysFloat(str(exc)) from exc


def _repacked(tensor: GGUFTensor) -> QuantizedWeight:
    type_id = int(tensor.tensor_type)
    if not can_repack(type_id) or len(tensor.shape) != 2:
        raise _StaysFloat(tensor.tensor_type.name)
    try:
        weight = repack(type_id, tensor.data, tensor.shape)
    except QuantizationError as exc:
        raise ModelLoadError(f"GGUF tensor {tensor.gguf_name!r} "
                             f"({BLOCKS[type_id][0]}): {exc}") from exc
    return weight if tensor.row_order is None else take_rows(weight, tensor.row_order)


def _shard(weight: QuantizedWeight, slot: WeightSlot) -> QuantizedWeight:
    """This rank's part of ``weight``, padded as the slot pads (a vocabulary split)."""
    end = slot.shard_start + slot.shard_size
    if slot.shard_dim == 0:
        weight = take_rows(weight, slice(slot.shard_start, end))
    elif slot.shard_dim == 1:
        try:
            weight = take_inputs(weight, slot.shard_start, slot.shard_size)
        except QuantizationError as exc:
            raise _StaysFloat(str(exc)) from exc
    return pad_rows(weight, slot.target().shape[0])
