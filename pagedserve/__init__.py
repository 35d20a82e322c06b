"""pagedserve: a paged-KV inference engine behind an OpenAI-compatible aiohttp server, a
token-budgeted asyncio client and a load generator.

``from pagedserve import LLM, SamplingParams`` is the offline API; ``pagedserve.client`` the
HTTP client; ``pagedserve.loadgen`` the load generator. Heavy imports (torch) happen on first
use of ``LLM``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedserve.common.sampling_params import BeamSearchParams, SamplingParams
    from pagedserve.server.llm import LLM

__all__ = ["LLM", "BeamSearchParams", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import pagedserve.server

        return getattr(pagedserve.server, name)
    raise AttributeError(f"module 'pagedserve' has no attribute {name!r}")
