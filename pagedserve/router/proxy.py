"""Forwarding one request: try the route's replicas in order, then pass the answer through.

A request may move to the next replica until its first byte reaches the client: a failed
connection, a reset, a 5xx or 429 answer, or a stream that breaks before its first chunk.
After that the bytes go through as they arrive, unbuffered; a stream that breaks later ends
with an OpenAI-shaped error event, as the server's own streams do. A client that goes away
cancels the handler (the runner's ``handler_cancellation``), which closes the upstream
connection, and the replica aborts the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from pagedserve.common.load_hints import HEADER_FREE_TOKENS, LoadHints
from pagedserve.router import error_responses
from pagedserve.router.policies import Route
from pagedserve.router.replicas import Replica
from pagedserve.router.state import RouterState

logger = logging.getLogger(__name__)
T = TypeVar("T")

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "content-encoding",
})
# A replica's load hints describe that replica, not the router; a client reading them would
# size its budget for one replica, so they stop here.
_HINT_PREFIX = HEADER_FREE_TOKENS.rsplit("-", 2)[0].lower()  # "x-pagedserve"
REPLICA_HEADER = "X-PagedServe-Replica"
# Answers worth trying elsewhere: the replica is full, draining, or its engine is dead.
_RETRY_STATUSES = frozenset({429, 502, 503, 504})


class _TryElsewhere(Exception):
    """This replica failed before anything reached the client."""

    def __init__(self, reason: str, response: web.Response | None = None) -> None:
        super().__init__(reason)
        self.response = response


async def forward(request: web.Request, body: bytes | None, route: Route) -> web.StreamResponse:
    state = RouterState.of(request)
    attempts = route.replicas[:state.config.max_attempts]
    if not attempts:
        state.metrics.failures.labels("503").inc()
        return error_responses.no_replica()
    failure: _TryElsewhere | None = None
    for index, replica in enumerate(attempts):
        if index:
            state.metrics.retries.labels(attempts[index - 1].url).inc()
        state.metrics.count_routed(replica.url)
        replica.in_flight += 1
        try:
            return await _attempt(request, state, replica, body)
        except _TryElsewhere as exc:
            failure = exc
        finally:
            replica.in_flight -= 1
    assert failure is not None
    if failure.response is not None:  # every replica answered "not now": the last one's answer
        return failure.response
    state.metrics.failures.labels("502").inc()
    return error_responses.upstream_failed(len(attempts), str(failure))


def forward_headers(headers: Mapping[str, str], peer: str | None) -> CIMultiDict[str]:
    out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)
    if peer:
        earlier = out.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{earlier}, {peer}" if earlier else peer
    return out


def _response_headers(upstream: aiohttp.ClientResponse, replica: Replica) -> CIMultiDict[str]:
    out = CIMultiDict((k, v) for k, v in upstream.headers.items()
                      if k.lower() not in _HOP_BY_HOP and not k.lower().startswith(_HINT_PREFIX))
    out[REPLICA_HEADER] = replica.url
    return out


async def _attempt(request: web.Request, state: RouterState, replica: Replica,
                   body: bytes | None) -> web.StreamResponse:
    upstream, first = await _until_ejected(replica, _open(request, state, replica, body))
    async with upstream:
        if upstream.content_type == "text/event-stream":
            return await _stream(request, state, replica, upstream, first)
        return web.Response(status=upstream.status, body=first,
                            headers=_response_headers(upstream, replica))


async def _open(request: web.Request, state: RouterState, replica: Replica,
                body: bytes | None) -> tuple[aiohttp.ClientResponse, bytes]:
    """The replica's response and its first bytes (a stream's first chunk, or the whole body
    of an answer that is not streamed): until then the request may still go elsewhere."""
    config = state.config
    timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout,
                                    sock_read=config.upstream_timeout)
    headers = forward_headers(request.headers, request.remote)
    state.tracing.inject(headers)
    upstream: aiohttp.ClientResponse | None = None
    try:
        upstream = await state.session.request(
            request.method, replica.url + request.path_qs, data=body, headers=headers,
            timeout=timeout)
        hints = LoadHints.from_headers(upstream.headers)
        if hints is not None:
            replica.hints = hints
        if upstream.status in _RETRY_STATUSES:
            raise await _refusal(state, replica, upstream)
        if upstream.content_type == "text/event-stream":
            return upstream, await upstream.content.readany()
        return upstream, await upstream.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        if upstream is not None:
            upstream.close()
        state.replicas.eject(replica, f"request failed: {exc!r}")
        raise _TryElsewhere(f"{replica.url}: {exc!r}") from exc
    except BaseException:
        if upstream is not None:
            upstream.close()
        raise


async def _until_ejected(replica: Replica, opening: Coroutine[Any, Any, T]) -> T:
    """``opening``'s result, unless the replica is ejected first (a health check found it
    hung): then the request has sent nothing to the client yet and tries elsewhere."""
    task = asyncio.current_task()
    assert task is not None
    replica.waiting.add(task)
    try:
        return await opening
    except asyncio.CancelledError:
        if task not in replica.cut_off:
            raise  # the client left
        replica.cut_off.discard(task)
        # The client may have left in the same moment: its cancellation still counts.
        if sys.version_info >= (3, 11) and task.uncancel():
            raise
        raise _TryElsewhere(f"{replica.url} was ejected while the request waited on it"
                            ) from None
    finally:
        replica.waiting.discard(task)


async def _refusal(state: RouterState, replica: Replica,
                   upstream: aiohttp.ClientResponse) -> _TryElsewhere:
    try:
        data = await upstream.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        data = None
        reason = f"{replica.url}: {exc!r}"
    if upstream.status == 503:  # draining or its engine died: out until /health says 200
        state.replicas.eject(replica, "answered 503")
    if data is None:
        return _TryElsewhere(reason)
    answer = web.Response(status=upstream.status, body=data,
                          headers=_response_headers(upstream, replica))
    return _TryElsewhere(f"{replica.url} answered {upstream.status}", answer)


class _ProxiedStream(web.StreamResponse):
    """A stream whose headers leave with its first chunk: one write, not two (aiohttp's own
    ``web.Response`` buffers its headers the same way)."""

    _send_headers_immediately = False


async def _stream(request: web.Request, state: RouterState, replica: Replica,
                  upstream: aiohttp.ClientResponse, first: bytes) -> web.StreamResponse:
    response = _ProxiedStream(status=upstream.status,
                              headers=_response_headers(upstream, replica))
    await response.prepare(request)
    content = upstream.content
    chunk = first
    while chunk:
        try:
            if content.at_eof():  # the last chunk: it and the stream's end in one write
                await response.write_eof(chunk)
                return response
            await response.write(chunk)
        except ConnectionResetError:
            upstream.close()  # the client left: closing the connection aborts the generation
            return response
        try:
            chunk = await content.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            state.replicas.eject(replica, f"stream broke: {exc!r}")
            await _write_error_event(response, replica)
            break
    await response.write_eof()
    return response


async def _write_error_event(response: web.StreamResponse, replica: Replica) -> None:
    error = {"error": {"message": f"The replica {replica.url} failed mid-stream.",
                       "type": error_responses.UNAVAILABLE, "param": None,
                       "code": "upstream_failed"}}
    with contextlib.suppress(ConnectionResetError):
        await response.write(b"data: " + orjson.dumps(error) + b"\n\n")
