"""Server-Sent Events as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``
(the Responses API: ``event: TYPE`` before each ``data:`` line, and no ``[DONE]``).

Once the 200 and its headers are out, an error can no longer change the status, so it goes
to the client as one more event, ``data: {"error": {...}}``, followed by ``[DONE]`` so that
readers end cleanly instead of seeing a dropped connection.

A stream silent for ``--stream-keepalive-interval`` (a request waiting in the queue, a long
prefill) gets an SSE comment, ``: keep-alive``, where its request asks for them (the
``X-PagedServe-Keepalive`` header, which the router sends): proxies in between then time out
only a stream whose server has gone quiet, and clients that do not skip comments never see
one. The comments stop
while the engine is stalled (``--engine-stall-timeout``), so that a hung step does not look
alive from outside.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.api.http.api_errors import from_exception

DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": keep-alive\n\n"


@dataclass(frozen=True)
class StreamLiveness:
    """When a silent stream gets a keep-alive comment: every ``interval`` seconds (None:
    never), while the engine has been stalled for no longer than ``stall_timeout``
    (``stalled_for()``)."""

    interval: float | None
    stall_timeout: float
    stalled_for: Callable[[], float]


def encode_event(payload: Any) -> bytes:
    return b"data: " + bytes(orjson.dumps(payload)) + b"\n\n"


def encode_typed_event(payload: dict[str, Any]) -> bytes:
    """The Responses API's form: the event's ``type`` named on an ``event:`` line too."""
    return b"event: " + str(payload["type"]).encode() + b"\n" + encode_event(payload)


async def stream_events(request: web.Request, chunks: AsyncIterator[list[dict[str, Any]]],
                        liveness: StreamLiveness) -> web.StreamResponse:
    """Sends each list of chunks the iterator yields as one write (one step's worth)."""
    return await _stream(request, chunks, liveness, encode_event, _error_chunk, DONE_EVENT)


async def stream_typed_events(request: web.Request,
                              events: AsyncIterator[list[dict[str, Any]]],
                              liveness: StreamLiveness) -> web.StreamResponse:
    """The Responses API's stream: typed events, an ``error`` event for a failure after the
    200, and no ``[DONE]``."""
    return await _stream(request, events, liveness, encode_typed_event, _error_event, b"")


def _error_chunk(exc: Exception, request: web.Request) -> dict[str, Any]:
    return from_exception(exc, request).error_object()


def _error_event(exc: Exception, request: web.Request) -> dict[str, Any]:
    error = from_exception(exc, request).error_object()["error"]
    return {"type": "error", "code": error.get("code"), "message": error["message"],
            "param": error.get("param")}


async def _stream(request: web.Request, chunks: AsyncIterator[list[dict[str, Any]]],
                  liveness: StreamLiveness, encode: Callable[[dict[str, Any]], bytes],
                  error: Callable[[Exception, web.Request], dict[str, Any]],
                  done: bytes) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    keepalive = _KeepAlive(response, liveness) if liveness.interval is not None else None
    try:
        async for batch in chunks:
            if batch:
                await response.write(b"".join(encode(chunk) for chunk in batch))
                if keepalive is not None:
                    keepalive.last_write = keepalive.loop.time()
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone; the caller's cleanup aborts the engine requests
    except Exception as exc:
        await response.write(encode(error(exc, request)))
    finally:
        if keepalive is not None:
            keepalive.stop()
    if done:
        await response.write(done)
    await response.write_eof()
    return response


class _KeepAlive:
    """Writes ``KEEPALIVE_COMMENT`` when the stream has been silent for the interval and the
    engine is not stalled. One timer per stream, re-armed only when it fires: the stream's
    own writes just note the time."""

    def __init__(self, response: web.StreamResponse, liveness: StreamLiveness) -> None:
        self.loop = asyncio.get_running_loop()
        self.last_write = self.loop.time()
        self._response = response
        self._stalled_for = liveness.stalled_for
        assert liveness.interval is not None
        self._interval = liveness.interval
        self._stall_timeout = liveness.stall_timeout
        self._writes: set[asyncio.Future[None]] = set()
        self._timer = self.loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        now = self.loop.time()
        due = self.last_write + self._interval
        if now >= due:
            if self._stalled_for() <= self._stall_timeout:
                write = asyncio.ensure_future(self._response.write(KEEPALIVE_COMMENT))
                self._writes.add(write)
                write.add_done_callback(self._written)
            self.last_write, due = now, now + self._interval
        self._timer = self.loop.call_at(due, self._tick)

    def _written(self, write: asyncio.Future[None]) -> None:
        self._writes.discard(write)
        if not write.cancelled():
            write.exception()  # a client gone meanwhile: the stream's own write finds out

    def stop(self) -> None:
        self._timer.cancel()
