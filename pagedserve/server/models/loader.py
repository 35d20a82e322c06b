"""``load_model``: a checkpoint directory (config.json + safetensors) or a GGUF file → a model
on the device, ready for inference (``source.py`` reads either).

The model is built on the meta device (no memory, no random init), the checkpoint's names,
shapes and tensor types are checked against it, its parameters are then allocated once in the
target dtype and device, and the checkpoint is copied in. Under ``--quantization gguf`` the
projections a kernel runs are built from the file's blocks first and their float parameters
released before anything is written to them (an allocation that is never written takes no
memory), so the float model is never held.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from pagedserve.common.gguf_file import release_gguf_files
from pagedserve.common.process_memory import trim_heap
from pagedserve.kernels.cpu_block_quant import with_activations
from pagedserve.kernels.dispatch import KernelOps, get_kernel_ops
from pagedserve.kernels.quantized_linear import QuantKernel
from pagedserve.kernels.weight_arena import ARENA
from pagedserve.server.models.base import CausalLM
from pagedserve.server.models.cpu_dtype import choose_cpu_dtype
from pagedserve.server.models.gguf_quantized import keep_gguf_types
from pagedserve.server.models.model_config import DTYPES, ModelConfig, parse_dtype
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import check_tensor_parallel, pack_linear_layers
from pagedserve.server.models.quantized_linear import (
    QuantizationReport,
    check_quantization,
    quantize_linear_layers,
    weight_bytes,
)
from pagedserve.server.models.registry import get_model_class
from pagedserve.server.models.source import check_model_path, load_config, model_weights
from pagedserve.server.models.weights import check_weights, load_weights, released, weight_slots

logger = logging.getLogger(__name__)

def resolve_dtype(
    dtype: str | torch.dtype, config: ModelConfig, device: torch.device,
    quantization: str = "none",
) -> torch.dtype:
    """The dtype to run in. ``"auto"`` follows the checkpoint's ``torch_dtype`` on accelerators
    (float16 for bfloat16 checkpoints on GPUs without bfloat16); on CPU it is bfloat16 where
    the CPU has native bfloat16 instructions and the weights are float (``quantization``
    ``none``), else float32 (``cpu_dtype.py``; logged).
    bfloat16 logits carry 8 significant bits, so a near-tied greedy pick can change with the
    batch around it: pass float32 where runs must agree token for token."""
    if dtype != "auto":
        return parse_dtype(dtype)
    if device.type == "cpu":
        choice = choose_cpu_dtype(quantized=quantization != "none")
        logger.info("--dtype auto: %s, because %s", choice.dtype, choice.reason)
        return choice.dtype
    chosen = DTYPES.get(str(config.torch_dtype), torch.float32)
    if chosen == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return chosen


def default_quantization(model_dir: Path, quantization: str | None) -> str:
    """``quantization``, or where it is None: ``gguf`` for a GGUF file, else ``none``."""
    return quantization or ("none" if model_dir.is_dir() else "gguf")


def materialize(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Replaces meta parameters with uninitialised ones of ``dtype`` on ``device`` (tied
    parameters stay one tensor) and moves buffers, which keep their own dtype."""
    made: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in made:
                empty = torch.empty(param.shape, dtype=dtype, device=device)
                made[id(param)] = (param, nn.Parameter(empty, requires_grad=False))
            setattr(module, name, made[id(param)][1])
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, buffer.to(device))


def _projections_from_blocks(model: CausalLM, path: Path, config: ModelConfig,
                             kernels: tuple[QuantKernel, ...],
                             report: QuantizationReport) -> frozenset[str]:
    """``--quantization gguf`` before any float weight is written: each projection a kernel
    takes is built from the file's blocks, and the float parameter it replaces is released
    untouched, so that it never takes memory. Returns the checkpoint names placed that way."""
    slots, _ = weight_slots(model)
    report.kernels = keep_gguf_types(model, path, config, kernels)
    return released(model, slots)


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    kernel_ops: KernelOps | None = None,
    *,
    backend: str | None = None,
    group: TensorParallelGroup | None = None,
    quantization: str | None = None,
    quantized_activations: str = "int8",
) -> tuple[CausalLM, ModelConfig]:
    """Loads a Hugging Face-format directory or a GGUF file. Without ``kernel_ops`` the ops
    come from ``get_kernel_ops(device, backend)`` (``backend=None``:
    $PAGEDSERVE_KERNEL_BACKEND). With a tensor-parallel ``group`` only this rank's shard is
    read and held. ``quantization`` ``int8`` / ``int4`` quantizes the projections after
    loading (``quantized_linear.py``), ``gguf`` keeps a GGUF file's quantized projections as
    stored where a kernel runs their type (``gguf_quantized.py``), ``none`` keeps every
    weight float; None: ``gguf`` for a GGUF file, else ``none``. ``quantized_activations``:
    what the block-quant kernel rounds activations to, ``int8`` (llama.cpp's rounding) or
    ``int16`` (``cpu_block_quant.py``)."""
    model_dir = check_model_path(model_dir)
    quantization = default_quantization(model_dir, quantization)
    check_quantization(quantization)
    if quantization == "gguf" and model_dir.is_dir():
        raise ModelLoadError(f"quantization 'gguf' keeps the tensor types of a GGUF file; "
                             f"{str(model_dir)!r} is a Hugging Face-format directory")
    config = load_config(model_dir)
    model_class = get_model_class(config.architecture)
    group = group if group is not None else TensorParallelGroup()
    check_tensor_parallel(config, group.world_size)
    device = torch.device(device)
    run_dtype = resolve_dtype(dtype, config, device, quantization)
    ops = kernel_ops if kernel_ops is not None else get_kernel_ops(device, backend)
    try:
        kernels = with_activations(ops.quantized_kernels, quantized_activations)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    with torch.device("meta"):
        model = model_class(config, ops, group)
    report = QuantizationReport()
    try:
        check_weights(model, model_weights(model_dir, config), str(model_dir))
        materialize(model, run_dtype, device)
        placed: frozenset[str] = frozenset()
        if quantization == "gguf":
            placed = _projections_from_blocks(model, model_dir, config, kernels, report)
        load_weights(model, model_weights(model_dir, config), str(model_dir), placed=placed)
    finally:
        # The engine reads the tokenizer first, so a GGUF file's header is not needed again.
        release_gguf_files()
        ARENA.seal()  # the next model's weights start a region of their own
        trim_heap()  # what repacking and reading the file freed
    model.eval()
    if quantization not in ("none", "gguf"):
        report.kernels = quantize_linear_layers(model, quantization, kernels)
    packed = pack_linear_layers(model, ops.linear_packing)
    report.weight_bytes = weight_bytes(model)
    if config.note:
        logger.warning("model %s: %s", model_dir, config.note)
    logger.info(
        "loaded %s from %s: %s, %s, kernels %s%s%s",
        config.architecture, model_dir, run_dtype, device, ops.name,
        f" ({packed} linear layers prepacked for oneDNN)" if packed else "",
        f", tensor-parallel rank {group.rank} of {group.world_size}" if group.world_size > 1
        else "",
    )
    file_size = "" if model_dir.is_dir() else f" (file {model_dir.stat().st_size / 2**20:.1f} MiB)"
    logger.info("quantization %s: %s%s", quantization, report.describe(), file_size)
    return model, config
