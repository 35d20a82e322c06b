"""Where pagedserve keeps what it builds once per machine: the embedded model, native kernels."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PAGEDSERVE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$PAGEDSERVE_CACHE_DIR``, else ``~/.cache/pagedserve``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pagedserve")
