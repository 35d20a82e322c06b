"""One loader interface, two sources: a Hugging Face directory (config.json + safetensors) or
a GGUF file (metadata + tensors). Both give the same ``ModelConfig`` and the same
(Hugging Face name, tensor) stream, so nothing above the loader tells them apart."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from pagedserve.common.gguf_file import GGUF_SUFFIX, GGUFFileError, is_gguf_file, open_gguf
from pagedserve.server.models.fused_weights import split_fused
from pagedserve.server.models.gguf_config import gguf_model_config
from pagedserve.server.models.gguf_weights import gguf_weights
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.registry import get_model_class
from pagedserve.server.models.weight_slot import TensorSource
from pagedserve.server.models.weights import checkpoint_files, iterate_weights


def check_model_path(model_path: str | os.PathLike[str]) -> Path:
    """``model_path`` if it is a directory or a GGUF file, else ModelLoadError."""
    path = Path(model_path)
    if path.is_dir() or is_gguf_file(path):
        return path
    if not path.exists():
        kind = "GGUF file" if path.suffix.lower() == GGUF_SUFFIX else "model directory"
        raise ModelLoadError(f"{kind} {str(path)!r} does not exist")
    raise ModelLoadError(f"model {str(path)!r} is neither a directory nor a GGUF file")


def open_gguf_model(path: Path) -> Any:
    try:
        return open_gguf(path)
    except GGUFFileError as exc:
        raise ModelLoadError(str(exc)) from exc


def load_config(model_path: str | os.PathLike[str]) -> ModelConfig:
    """The config of a checkpoint directory or a GGUF file."""
    path = check_model_path(model_path)
    if path.is_dir():
        return ModelConfig.from_pretrained(path)
    return gguf_model_config(open_gguf_model(path))


def model_weights(
    model_path: str | os.PathLike[str], config: ModelConfig
) -> Iterable[tuple[str, torch.Tensor | TensorSource]]:
    """(Hugging Face name, unread tensor) for every tensor of the source."""
    path = check_model_path(model_path)
    if path.is_dir():
        fused = get_model_class(config.architecture).fused_tensors(config)
        return split_fused(iterate_weights(checkpoint_files(path)), fused, config.architecture)
    return gguf_weights(open_gguf_model(path), config)
