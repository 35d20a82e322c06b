"""Load hints: headers on every response and ``GET /load``, from one ``engine.stats()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from pagedserve.common.load_hints import LoadHints
from pagedserve.server.api.jsonio import json_response
from pagedserve.server.api.state import ENGINE_KEY

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import EngineStats


_UNAUTHENTICATED = frozenset({401, 403})


def _hints(stats: EngineStats) -> LoadHints:
    return LoadHints(
        kv_cache_usage=stats.kv_cache_usage,
        num_waiting=stats.num_waiting,
        num_running=stats.num_running,
        free_token_capacity=stats.free_token_capacity,
        num_preemptions=stats.num_preemptions,
    )


async def add_load_hints(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the engine's load as of this response; none for a client
    that has not authenticated."""
    engine = request.app.get(ENGINE_KEY)
    if engine is not None and response.status not in _UNAUTHENTICATED:
        response.headers.update(_hints(engine.stats()).to_headers())


async def get_load(request: web.Request) -> web.Response:
    stats = request.app[ENGINE_KEY].stats()
    body = {
        **_hints(stats).to_json(),
        "max_num_seqs": stats.max_num_seqs,
        "max_num_batched_tokens": stats.max_num_batched_tokens,
        "total_kv_tokens": stats.total_kv_tokens,
    }
    return json_response(body)
