"""pagedserve's server side: the paged-KV engine, its models and the HTTP API.

Heavy imports (torch) happen on first use of ``LLM`` so that ``pagedserve.cli`` and
the API's light modules import quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedserve.common.sampling_params import BeamSearchParams, SamplingParams
    from pagedserve.server.llm import LLM

__all__ = ["LLM", "BeamSearchParams", "SamplingParams"]

_EXPORTS = {
    "LLM": "pagedserve.server.llm",
    "SamplingParams": "pagedserve.common.sampling_params",
    "BeamSearchParams": "pagedserve.common.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagedserve.server' has no attribute {name!r}")
