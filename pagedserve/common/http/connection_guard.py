"""The listening socket's guard: a cap on open connections, a deadline for a new
connection's request headers, and the ``Expect: 100-continue`` answer.

aiohttp's own protocol (one ``RequestHandler`` per connection) does the HTTP; the guard wraps
its factory. Past ``max_connections`` a new connection is not handed to aiohttp (but for a few
kept for health probes): it gets a 503 in OpenAI's shape and is closed, so idle clients can
never use up the process's file descriptors and lock everyone out; past its share of them one
source address gets 429 (but a trusted proxy: its connections carry many clients' requests,
so only the cap on all connections bounds them). Idle keep-alive connections are closed by
aiohttp after ``timeout_keep_alive`` (passed to the runner).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Protocol

import orjson
from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.web_protocol import RequestHandler

from pagedserve.common.errors import APIError
from pagedserve.common.http.client_limits import ClientCounter, over_client_share, peer_host
from pagedserve.common.http.forwarded import TrustedProxies
from pagedserve.common.http.json_errors import (
    INVALID_REQUEST,
    UNAVAILABLE,
    body_too_large,
    error_response,
)

_HEAD_END = b"\r\n\r\n"
# How long a refused connection may take to send its request before it is answered anyway.
_REFUSAL_WAIT_S = 1.0
_RETRY_AFTER_S = 1
# Connections past the cap that may still ask for /health or /metrics (and nothing else).
PROBE_CONNECTIONS = 32
# Descriptors the process needs besides its connections: model files, logs, the listener.
_SPARE_DESCRIPTORS = 128

logger = logging.getLogger(__name__)


class ConnectionLimits(Protocol):
    """What the guard reads of a front's settings (the server's ``ServerLimits``, the
    router's ``RouterConfig``)."""

    @property
    def max_connections(self) -> int: ...
    @property
    def max_connections_per_client(self) -> int: ...
    @property
    def timeout_header_read(self) -> float: ...


class ConnectionGuard:
    """A protocol factory for ``loop.create_server`` around aiohttp's.

    Each connection is let in, let in for probes only, or refused once its source address is
    known (``connection_made``): past ``max_connections_per_client`` from one address it gets
    429; past ``max_connections`` it may still take one of ``probe_connections`` reserved for
    ``/health`` and ``/metrics`` (so that a full server still answers its probes), else 503.
    With ``max_connections`` 0 every connection is a probe's (the ``--health-port`` site).
    ``probe_only`` maps the transports of probe connections to the error they get for any
    other path, for the admission gate."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limits: ConnectionLimits,
                 probe_only: dict[asyncio.BaseTransport, Callable[[], APIError]],
                 max_connections: int | None = None,
                 probe_connections: int = PROBE_CONNECTIONS,
                 proxies: TrustedProxies | None = None,
                 on_close: Callable[[asyncio.BaseTransport], None] | None = None) -> None:
        self._factory = factory
        self.limits = limits
        self.max_connections = (limits.max_connections if max_connections is None
                                else max_connections)
        self.probe_connections = probe_connections
        self.probe_only = probe_only
        self.per_client = ClientCounter(limits.max_connections_per_client)
        self.proxies = TrustedProxies() if proxies is None else proxies
        self._on_close = on_close  # what else counts the connection (its API key's share)
        self.num_open = 0
        self.num_probes = 0
        self.num_refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Gate(self)

    def admit(self, transport: asyncio.BaseTransport) -> asyncio.Protocol:
        """The protocol that serves (or refuses) a connection just made."""
        peer = peer_host(transport)
        # The client whose share this connection counts against; None for none.
        client = peer if self.max_connections and not self.proxies.trusts(peer) else None
        if client is not None and not self.per_client.try_acquire(client):
            self.num_refused += 1
            return _Refusal(over_client_share(
                "connections", f"open from {client or 'this client'}",
                self.per_client.limit, "--max-connections-per-client"))
        if self.num_open < self.max_connections:
            self.num_open += 1
            return _Guarded(self._factory(), self, client, probe=False)
        if self.num_probes < self.probe_connections:
            self.num_probes += 1
            self.probe_only[transport] = (
                self._not_a_probe if self.max_connections else not_on_health_port)
            return _Guarded(self._factory(), self, client, probe=True)
        if client is not None:
            self.per_client.release(client)
        self.num_refused += 1
        return _Refusal(too_many_connections(self.max_connections))

    def closed(self, transport: asyncio.BaseTransport, client: str | None,
               probe: bool) -> None:
        if probe:
            self.num_probes -= 1
            self.probe_only.pop(transport, None)
        else:
            self.num_open -= 1
        if client is not None:
            self.per_client.release(client)
        if self._on_close is not None:
            self._on_close(transport)

    def _not_a_probe(self) -> APIError:
        error = too_many_connections(self.max_connections)
        error.message += " Only /health and /metrics are answered on this connection."
        return error


def not_on_health_port() -> APIError:
    return APIError("Only /health and /metrics are served on the health port.", status=404,
                    type=INVALID_REQUEST, code="unknown_url")


def too_many_connections(limit: int) -> APIError:
    return APIError(f"The server has {limit} connections open, its limit; retry shortly.",
                    status=503, type=UNAVAILABLE, code="too_many_connections",
                    headers={"Retry-After": str(_RETRY_AFTER_S)})


class _Gate(asyncio.Protocol):
    """Stands for a connection until it is made; from then on its chosen protocol does."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._chosen: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._chosen = self._guard.admit(transport)
        self._chosen.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        assert self._chosen is not None
        self._chosen.data_received(data)

    def eof_received(self) -> bool | None:
        assert self._chosen is not None
        return self._chosen.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._chosen is not None:
            self._chosen.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._chosen is not None:
            self._chosen.pause_writing()

    def resume_writing(self) -> None:
        if self._chosen is not None:
            self._chosen.resume_writing()


class _Guarded(asyncio.Protocol):
    """Passes everything to aiohttp's protocol; closes a connection whose first request head
    has not arrived within ``timeout_header_read``.

    aiohttp arms its keep-alive timer as a connection opens and closes it at that timeout if
    no whole request has come by then; that timer is stopped here, so that the first head
    gets ``timeout_header_read`` as configured, not the smaller of the two. aiohttp re-arms
    it after each response, where it bounds the wait for the next request."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard, client: str | None,
                 probe: bool) -> None:
        self._inner = inner
        self._guard = guard
        self._client = client
        self._probe = probe
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        timeout = self._guard.limits.timeout_header_read
        self._deadline = asyncio.get_running_loop().call_later(timeout, transport.close)
        self._inner.connection_made(transport)
        if isinstance(self._inner, RequestHandler):
            self._inner.keep_alive(True)  # stops the timer only: keep-alive stays on

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
        if self._transport is not None:
            self._guard.closed(self._transport, self._client, self._probe)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _Refusal(asyncio.Protocol):
    """Waits (briefly) for the request head, answers ``error`` and closes."""

    def __init__(self, error: APIError) -> None:
        self._error = error
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

    def eof_received(self) -> bool | None:
        return None

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
        error = self._error
        body = orjson.dumps(error.error_object())
        headers = "".join(f"{name}: {value}\r\n" for name, value in error.headers.items())
        status = error.status or HTTPStatus.INTERNAL_SERVER_ERROR  # the server sets one
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{headers}Connection: close\r\n\r\n")
        self._transport.write(head.encode() + body)
        self._transport.close()


class GuardedTCPSite(web.BaseSite):
    """``web.TCPSite`` with a ``ConnectionGuard`` in front of the runner's protocol."""

    __slots__ = ("_host", "_port", "guard")

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self.guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def urls(self) -> list[str]:
        """Where the site listens, once started (the real port when 0 was asked for)."""
        # uvloop's server is no asyncio.Server, but has the same ``sockets``.
        sockets: Sequence[socket.socket] = getattr(self._server, "sockets", None) or ()
        return [f"http://{sock.getsockname()[0]}:{sock.getsockname()[1]}" for sock in sockets]

    async def start(self) -> None:
        await super().start()
        ensure_descriptors(self.guard.max_connections + self.guard.probe_connections)
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


# What a probe connection may ask for; a request for anything else gets its refusal.
OPEN_PATHS = frozenset({"/health", "/metrics"})


async def serve_probe(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                      refusal: Callable[[], APIError]) -> web.StreamResponse:
    """A probe connection's request: its answer, or its error (``/health``'s 503 while
    draining), closes the connection, which frees the slot for the next probe."""
    if request.path not in OPEN_PATHS:
        error = refusal()
        error.close_connection = True
        raise error
    try:
        response = await handler(request)
    except APIError as exc:
        exc.close_connection = True
        raise
    response.force_close()
    return response
