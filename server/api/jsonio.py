"""JSON in and out with orjson."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.api.errors import invalid_request


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge → 413
    except web.RequestPayloadError as exc:
        # A body that does not decode as its Content-Encoding says (or broken chunked
        # framing). Nothing after it on this connection can be parsed: the answer closes it,
        # and the unreadable rest is not drained.
        request.content.feed_eof()
        encoding = request.headers.get("Content-Encoding")
        what = f"as Content-Encoding {encoding!r}" if encoding else "(malformed framing)"
        error = invalid_request(f"The request body could not be decoded {what}.")
        error.close_connection = True
        raise error from exc
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from exc


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body),
                        content_type="application/json")
