"""The listening socket's guard: a cap on open connections, a deadline for a new
connection's request headers, and the ``Expect: 100-continue`` answer.

aiohttp's own protocol (one ``RequestHandler`` per connection) does the HTTP; the guard wraps
its factory. Past ``max_connections`` a new connection is not handed to aiohttp: it gets a
503 in OpenAI's shape and is closed, so idle clients can never use up the process's file
descriptors and lock everyone out. Idle keep-alive connections are closed by aiohttp after
``timeout_keep_alive`` (passed to the runner).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable

import orjson
from aiohttp import web
from aiohttp.http import HttpVersion11

from pagedserve.server.api.config import ServerLimits
from pagedserve.server.api.errors import (
    INVALID_REQUEST,
    UNAVAILABLE,
    APIError,
    body_too_large,
    error_response,
)

_HEAD_END = b"\r\n\r\n"
# How long a refused connection may take to send its request before it is answered anyway.
_REFUSAL_WAIT_S = 1.0
_RETRY_AFTER_S = 1
# Descriptors the process needs besides its connections: model files, logs, the listener.
_SPARE_DESCRIPTORS = 128

logger = logging.getLogger(__name__)


class ConnectionGuard:
    """A protocol factory for ``loop.create_server`` around aiohttp's."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limits: ServerLimits) -> None:
        self._factory = factory
        self.limits = limits
        self.num_open = 0
        self.num_refused = 0

    def __call__(self) -> asyncio.Protocol:
        if self.num_open >= self.limits.max_connections:
            self.num_refused += 1
            return _Refusal(self.limits.max_connections)
        self.num_open += 1
        return _Guarded(self._factory(), self)

    def closed(self) -> None:
        self.num_open -= 1


class _Guarded(asyncio.Protocol):
    """Passes everything to aiohttp's protocol; closes a connection whose first request head
    has not arrived within ``timeout_header_read``."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        timeout = self._guard.limits.timeout_header_read
        self._deadline = asyncio.get_running_loop().call_later(timeout, transport.close)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._deadline is not None:
            # Only the boundary matters: keep the last bytes in case it spans two reads.
            seen = self._tail + data
            if _HEAD_END in seen:
                self._deadline.cancel()
                self._deadline = None
            self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._guard.closed()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _Refusal(asyncio.Protocol):
    """Waits (briefly) for the request head, answers 503 and closes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._seen = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_later(_REFUSAL_WAIT_S, self._answer)

    def data_received(self, data: bytes) -> None:
        self._seen = (self._seen + data)[-4096:]
        if _HEAD_END in self._seen:
            self._answer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def _answer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is None or self._transport.is_closing():
            return
        error = APIError(f"The server has {self._limit} connections open, its limit; "
                         "retry shortly.", status=503, type=UNAVAILABLE,
                         code="too_many_connections")
        body = orjson.dumps(error.error_object())
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {_RETRY_AFTER_S}\r\n"
                f"Connection: close\r\n\r\n")
        self._transport.write(head.encode() + body)
        self._transport.close()


class GuardedTCPSite(web.BaseSite):
    """``web.TCPSite`` with a ``ConnectionGuard`` in front of the runner's protocol."""

    __slots__ = ("_host", "_port", "guard")

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 limits: ServerLimits) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        assert runner.server is not None
        self.guard = ConnectionGuard(runner.server, limits)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        ensure_descriptors(self.guard.limits.max_connections)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.guard, self._host, self._port,
                                                backlog=self._backlog, reuse_address=True)


def ensure_descriptors(max_connections: int) -> int:
    """Raises the process's soft open-file limit (up to the hard one) so that the connection
    cap, not the descriptor table, is what turns clients away; returns the soft limit.

    Logs a warning when even the hard limit leaves too few descriptors."""
    needed = max_connections + _SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning("the open-file limit (%d) is below --max-connections (%d) plus %d "
                       "spare: raise `ulimit -n` or lower --max-connections", soft,
                       max_connections, _SPARE_DESCRIPTORS)
    return soft


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: a body announced over the limit gets 413 before it is sent;
    otherwise the client is told to go on."""
    if request.version != HttpVersion11:
        return None
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return error_response(APIError(f"Unknown Expect header value {expect!r}.", status=417,
                                       type=INVALID_REQUEST, code="expectation_failed"))
    size, limit = request.content_length, request.client_max_size
    if size is not None and size > limit:
        response = error_response(body_too_large(size, limit))
        # The body is not wanted: close the connection once answered instead of lingering
        # to read (and discard) a body the client may send anyway.
        request.content.feed_eof()
        response.force_close()
        return response
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the interim answer is not part of the response's size
    return None
