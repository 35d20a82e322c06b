"""Relaying a replica's event stream to the client once its first byte has gone out.

Whole events go through as they arrive (``event_framing.py``). The stream fails when the
replica goes silent for ``stream_idle_timeout`` (no chunk, not even a keep-alive comment),
resets or breaks the connection, sends what is not SSE, is ejected (``replicas.py``), or ends
without saying it is complete (a close-framed stream cut short, say). Then the client gets an
error event in the server's own shape, ``data: {"error": ...}`` and ``data: [DONE]`` (for the
Responses API an ``event: error``), never a silent end, and the failure counts toward the
replica's ejection (an ejection that ended the stream has counted already).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from pagedserve.common.errors import APIError
from pagedserve.common.http.json_errors import UNAVAILABLE
from pagedserve.common.load_hints import HEADER_KEEPALIVE
from pagedserve.router.event_framing import EventFraming, NotEventStream, only_comments
from pagedserve.router.replicas import Replica
from pagedserve.router.state import RouterState

UPSTREAM_FAILED = "upstream_failed"
# The Responses API streams typed events and ends with no [DONE].
_TYPED_EVENT_PATHS = frozenset({"/v1/responses"})
_DONE = b"data: [DONE]\n\n"


class ProxiedStream(web.StreamResponse):
    """A stream whose headers leave with its first chunk: one write, not two (aiohttp's own
    ``web.Response`` buffers its headers the same way)."""

    _send_headers_immediately = False


class _ClientLeft(Exception):
    pass


async def relay(request: web.Request, state: RouterState, replica: Replica,
                upstream: aiohttp.ClientResponse, first: bytes,
                headers: CIMultiDict[str] | None = None) -> web.StreamResponse:
    response = ProxiedStream(status=upstream.status, headers=headers)
    await response.prepare(request)
    task = asyncio.current_task()
    assert task is not None
    replica.streaming.add(task)
    counted = False  # an ejection that ends the stream has counted already
    try:
        failure, silent = await _pump(response, upstream, first,
                                      state.config.stream_idle_timeout,
                                      HEADER_KEEPALIVE in request.headers)
    except asyncio.CancelledError:
        if not replica.was_cut_off(task):
            raise  # the client left: closing the upstream connection aborts the generation
        failure, silent, counted = "it was ejected", True, True
    except _ClientLeft:
        upstream.close()
        return response
    finally:
        replica.streaming.discard(task)
    if failure is None:
        state.replicas.succeeded(replica)
        return response
    if not counted:
        state.replicas.failed(replica, f"stream failed: {failure}", silent)
    state.metrics.broken_streams.labels(replica.url).inc()
    await _end_with_error(response, request.path, replica, failure)
    return response


async def _pump(response: web.StreamResponse, upstream: aiohttp.ClientResponse, chunk: bytes,
                idle_timeout: float, comments: bool) -> tuple[str | None, bool]:
    """Passes events on until the stream ends: None when it said it was complete, else what
    went wrong; and whether the replica fell silent. The replica's keep-alive comments reach
    the client only where it asked for them (``comments``), as the server's own do."""
    framing = EventFraming()
    content = upstream.content
    while True:
        try:
            events = framing.whole(chunk)
        except NotEventStream as exc:
            return str(exc), False
        if not comments and events.startswith(b":") and only_comments(events):
            events = b""
        try:
            if content.at_eof():
                if framing.complete():  # its last events and the end in one write
                    await response.write_eof(events)
                    return None, False
                if events:
                    await response.write(events)
                return "it ended without [DONE] or a finish reason", False
            if events:
                await response.write(events)
        except ConnectionResetError:
            raise _ClientLeft from None
        try:
            chunk = await content.readany()
        except aiohttp.ServerTimeoutError:
            return f"no event for {idle_timeout:g} s", True
        except (TimeoutError, aiohttp.ClientError) as exc:
            return f"it broke: {exc!r}", isinstance(exc, TimeoutError)


async def _end_with_error(response: web.StreamResponse, path: str, replica: Replica,
                          failure: str) -> None:
    error = APIError(f"The replica {replica.url} failed mid-stream: {failure}.",
                     type=UNAVAILABLE, code=UPSTREAM_FAILED).error_object()
    if path in _TYPED_EVENT_PATHS:  # the server's own error event there, and no [DONE]
        event = {"type": "error", "code": UPSTREAM_FAILED, "message": error["error"]["message"],
                 "param": None}
        tail = b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
    else:
        tail = b"data: " + orjson.dumps(error) + b"\n\n" + _DONE
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof(tail)
