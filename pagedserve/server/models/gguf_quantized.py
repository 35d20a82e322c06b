"""``--quantization gguf``: a GGUF file's quantized projections run as stored.

After the float load (which checked every tensor's name and shape), each projection is rebuilt
from the file's raw blocks (``gguf_weight``: one tensor at a time, straight from the memory
map): rows in the Hugging Face order, cut to this rank's tensor-parallel shard and stacked as
the layer packs them (QKV, gate/up), each part keeping its own type, then handed to the kernel
the dispatch chooses (the C block-quant kernel runs every GGUF block type). Where no kernel
takes the blocks, a projection of Q4_0, Q4_1, Q4_K or Q8_0 is repacked for torch's int4 /
int8 ops (``gguf_repack``); anything else stays float (dequantized), and a warning names the
type and what the kernels here run. The embedding is looked up in the LM head's packed rows
when the two are tied, else in its own packed rows.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from pagedserve.kernels import block_quant_weight as blocks
from pagedserve.kernels.block_quant_weight import BlockQuantWeight
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
from pagedserve.kernels.weight_arena import ARENA
from pagedserve.server.models.gguf_repack import BLOCKS, can_repack, repack
from pagedserve.server.models.gguf_weights import GGUFTensor, gguf_tensors
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_layers import PackableLinear, VocabParallelEmbedding
from pagedserve.server.models.quantized_linear import EMBEDDING_NOTE
from pagedserve.server.models.source import open_gguf_model
from pagedserve.server.models.weight_slot import WeightSlot

logger = logging.getLogger(__name__)

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


class _StaysFloat(Exception):
    """Why a projection keeps its dequantized weight."""


def keep_gguf_types(model: nn.Module, path: Path, config: ModelConfig,
                    kernels: tuple[QuantKernel, ...]) -> Counter[str]:
    """Runs every projection of ``model`` that a kernel of ``kernels`` takes as the file
    stores it; returns how many projections each kernel runs (and on which types) and why
    the others stay float."""
    tensors = {t.name: t for t in gguf_tensors(open_gguf_model(path), config)}
    # One huge-page region for all of them; repacking adds a little, and the untouched rest
    # of the region is address space only (weight_arena.py).
    ARENA.expect(sum(t.mapped.nbytes for t in tensors.values()) * 9 // 8)
    if config.tie_word_embeddings and LM_HEAD not in tensors and EMBEDDING in tensors:
        tensors[LM_HEAD] = tensors[EMBEDDING]
    counts: Counter[str] = Counter()
    head: tuple[BlockQuantWeight | QuantizedWeight, QuantKernel, PackableLinear] | None = None
    for prefix, layer in model.named_modules():
        if not isinstance(layer, PackableLinear) or layer.weight is None:
            continue
        try:
            weight, kernel = _layer_weight(layer, prefix, tensors, kernels, layer.weight.device)
        except _StaysFloat as reason:
            counts[f"float ({reason})"] += 1
            continue
        layer.quantize(weight, kernel)
        counts[_kernel_note(kernel, weight)] += 1
        if prefix.endswith("lm_head"):
            head = (weight, kernel, layer)
    _warn_float(counts, kernels)
    embedding = _embedding(model)
    if embedding is not None and kernels:
        counts.update(_quantize_embedding(embedding, tensors, head, kernels,
                                          config.tie_word_embeddings))
    return counts


def _kernel_note(kernel: QuantKernel, weight: BlockQuantWeight | QuantizedWeight) -> str:
    if isinstance(weight, BlockQuantWeight):
        return f"{kernel.name} {'+'.join(weight.type_names)}"
    rescaled = weight.scheme == "int8" and weight.num_groups == 1
    return kernel.name + (" (int8 groups rescaled per channel)" if rescaled else "")


def _warn_float(counts: Counter[str], kernels: tuple[QuantKernel, ...]) -> None:
    floats = [name for name in counts if name.startswith("float (")]
    if floats and kernels:
        logger.warning("GGUF projections dequantized to float: %s; the quantized kernels here "
                       "run %s", ", ".join(f"{counts[n]} {n}" for n in floats),
                       ", ".join(n for n, block, _ in blocks.GGUF_BLOCKS.values() if block > 1))


def _embedding(model: nn.Module) -> VocabParallelEmbedding | None:
    found = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding)]
    return found[0] if len(found) == 1 else None


def _quantize_embedding(embedding: VocabParallelEmbedding, tensors: Mapping[str, GGUFTensor],
                        head: tuple[BlockQuantWeight | QuantizedWeight, QuantKernel,
                                    PackableLinear] | None,
                        kernels: tuple[QuantKernel, ...], tied: bool) -> Counter[str]:
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
    [(name, slot)] = embedding.checkpoint_slots(EMBEDDING.rpartition(".")[0], "weight")
    tensor = tensors.get(name)
    if tensor is None:
        return Counter()
    try:
        weight = _block_shard(_block_weight(tensor), slot)
        kernel = choose_kernel(kernels, weight, torch.device("cpu"))
        if kernel is not REFERENCE and kernel.lookup is not None:
            embedding.quantize(QuantizedTable(kernel.prepare(weight), kernel.lookup,
                                              weight.out_features, weight.in_features))
        else:
            embedding.quantize(_shard(_repacked(tensor), slot))
    except _StaysFloat:
        return Counter()
    return Counter({f"{EMBEDDING_NOTE}looked up in {tensor.tensor_type.name} blocks": 1})


def _layer_weight(layer: PackableLinear, prefix: str, tensors: Mapping[str, GGUFTensor],
                  kernels: tuple[QuantKernel, ...], device: torch.device
                  ) -> tuple[BlockQuantWeight | QuantizedWeight, QuantKernel]:
    """The projection's weight as the file's blocks and the kernel that takes them, else as
    int4 / int8 for a kernel that takes those; _StaysFloat otherwise."""
    slots = layer.checkpoint_slots(prefix, "weight")
    parts = []
    for name, _ in slots:
        if name not in tensors:
            raise _StaysFloat(f"no tensor {name}")
        parts.append(tensors[name])
    try:
        weight = blocks.concat_rows([_block_shard(_block_weight(t), slot)
                                     for t, (_, slot) in zip(parts, slots, strict=True)])
        kernel = choose_kernel(kernels, weight, device)
        if kernel is not REFERENCE:
            return weight, kernel
    except _StaysFloat:
        pass
    except QuantizationError as exc:
        raise _StaysFloat(str(exc)) from exc
    try:
        quantized = concat_rows([_shard(_rescaled(_repacked(t), kernels, device), slot)
                                 for t, (_, slot) in zip(parts, slots, strict=True)])
    except QuantizationError as exc:
        raise _StaysFloat(str(exc)) from exc
    kernel = choose_kernel(kernels, quantized, device)
    if kernel is REFERENCE:
        raise _StaysFloat(f"no kernel for {quantized.scheme} in groups of "
                          f"{quantized.group_size}")
    return quantized, kernel


def _block_weight(tensor: GGUFTensor) -> BlockQuantWeight:
    """The tensor's raw blocks, rows in the Hugging Face order (no copy of an unpermuted
    tensor)."""
    type_id = int(tensor.tensor_type)
    if type_id not in blocks.GGUF_BLOCKS or len(tensor.shape) != 2:
        raise _StaysFloat(tensor.tensor_type.name)
    try:
        weight = blocks.from_gguf(type_id, tensor.data, tensor.shape)
    except QuantizationError as exc:
        raise ModelLoadError(f"GGUF tensor {tensor.gguf_name!r}: {exc}") from exc
    return weight if tensor.row_order is None else blocks.take_rows(weight, tensor.row_order)


def _block_shard(weight: BlockQuantWeight, slot: WeightSlot) -> BlockQuantWeight:
    """This rank's part of ``weight``, padded as the slot pads (a vocabulary split)."""
    end = slot.shard_start + slot.shard_size
    try:
        if slot.shard_dim == 0:
            weight = blocks.take_rows(weight, slice(slot.shard_start, end))
        elif slot.shard_dim == 1:
            weight = blocks.take_inputs(weight, slot.shard_start, slot.shard_size)
    except QuantizationError as exc:
        raise _StaysFloat(str(exc)) from exc
    return blocks.pad_rows(weight, slot.target().shape[0])


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
