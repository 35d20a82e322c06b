"""Server-Sent Events as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``
(the Responses API: ``event: TYPE`` before each ``data:`` line, and no ``[DONE]``).

Once the 200 and its headers are out, an error can no longer change the status, so it goes
to the client as one more event, ``data: {"error": {...}}``, followed by ``[DONE]`` so that
readers end cleanly instead of seeing a dropped connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.api.http.api_errors import from_exception

DONE_EVENT = b"data: [DONE]\n\n"


def encode_event(payload: Any) -> bytes:
    return b"data: " + bytes(orjson.dumps(payload)) + b"\n\n"


def encode_typed_event(payload: dict[str, Any]) -> bytes:
    """The Responses API's form: the event's ``type`` named on an ``event:`` line too."""
    return b"event: " + str(payload["type"]).encode() + b"\n" + encode_event(payload)


async def stream_events(request: web.Request,
                        chunks: AsyncIterator[list[dict[str, Any]]]) -> web.StreamResponse:
    """Sends each list of chunks the iterator yields as one write (one step's worth)."""
    return await _stream(request, chunks, encode_event, _error_chunk, DONE_EVENT)


async def stream_typed_events(request: web.Request,
                              events: AsyncIterator[list[dict[str, Any]]]
                              ) -> web.StreamResponse:
    """The Responses API's stream: typed events, an ``error`` event for a failure after the
    200, and no ``[DONE]``."""
    return await _stream(request, events, encode_typed_event, _error_event, b"")


def _error_chunk(exc: Exception, request: web.Request) -> dict[str, Any]:
    return from_exception(exc, request).error_object()


def _error_event(exc: Exception, request: web.Request) -> dict[str, Any]:
    error = from_exception(exc, request).error_object()["error"]
    return {"type": "error", "code": error.get("code"), "message": error["message"],
            "param": error.get("param")}


async def _stream(request: web.Request, chunks: AsyncIterator[list[dict[str, Any]]],
                  encode: Callable[[dict[str, Any]], bytes],
                  error: Callable[[Exception, web.Request], dict[str, Any]],
                  done: bytes) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for batch in chunks:
            if batch:
                await response.write(b"".join(encode(chunk) for chunk in batch))
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone; the caller's cleanup aborts the engine requests
    except Exception as exc:
        await response.write(encode(error(exc, request)))
    if done:
        await response.write(done)
    await response.write_eof()
    return response
