"""JSON in and out with orjson; large bodies are decoded off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson
from aiohttp import web

from pagedserve.server.api.http.api_errors import invalid_request

# Bodies from this size on are decoded, parsed and tokenized in the tokenizer pool; below it
# the thread hop costs more than the work.
OFF_LOOP_BODY_BYTES = 64 * 1024

T = TypeVar("T")

# The threads that tokenize large inputs off the event loop.
TOKENIZER_POOL_KEY = web.AppKey("tokenizer_pool", ThreadPoolExecutor)


async def off_loop(request: web.Request, size: int | None, work: Callable[[], T]) -> T:
    """``work()`` inline when ``size`` (bytes of input) is small, else in the tokenizer pool,
    so that /health and the streams in flight keep being served meanwhile."""
    if size is not None and size < OFF_LOOP_BODY_BYTES:
        return work()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(request.app[TOKENIZER_POOL_KEY], work)


async def read_request(request: web.Request, parse: Callable[[Any], T]) -> T:
    """The body as JSON, checked by ``parse`` (a protocol parser)."""
    raw = await _read_body(request)
    return await off_loop(request, len(raw), lambda: parse(_loads(raw)))


async def _read_body(request: web.Request) -> bytes:
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
    return raw


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from exc


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body),
                        content_type="application/json")
