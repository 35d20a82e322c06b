"""JSON in and out with orjson."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.api.errors import invalid_request


async def read_json(request: web.Request) -> Any:
    raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge → 413
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from exc


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body),
                        content_type="application/json")
