"""Forwarding one request: try the route's replicas in order, then pass the answer through.

A request moves to the next replica until its first byte reaches the client: a failed
connection, a reset, a timeout (``stream_idle_timeout`` for a streamed request,
``upstream_timeout`` for the whole of another), any 5xx, a 429, or an event stream that ends
before its first byte. Each of these but a full replica's (429, or 503 for too many
connections) counts toward the replica's ejection; a replica that cannot be reached at all, or
says it is draining, is ejected at once. After the first byte an answer goes through as it
arrives, a stream event by event (``stream_relay.py``), and a failure there becomes an error
event, never a silent end. A client that goes away cancels the handler (the runner's
``handler_cancellation``), which closes the upstream connection, and the replica aborts the
generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from pagedserve.common.http.forwarded import FORWARDED, X_FORWARDED_FOR
from pagedserve.common.load_hints import HEADER_FREE_TOKENS, HEADER_KEEPALIVE, LoadHints
from pagedserve.router import error_responses
from pagedserve.router.policies import Route
from pagedserve.router.replicas import DRAINING, Replica, error_code
from pagedserve.router.state import RouterState
from pagedserve.router.stream_relay import relay

T = TypeVar("T")

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "content-encoding", "expect",
})
# A replica's load hints describe that replica, not the router; a client reading them would
# size its budget for one replica, so they stop here.
_HINT_PREFIX = HEADER_FREE_TOKENS.rsplit("-", 2)[0].lower()  # "x-pagedserve"
REPLICA_HEADER = "X-PagedServe-Replica"
# A replica that is full, not failing: worth another replica, not a count toward ejection.
_FULL_CODES = frozenset({"too_many_connections"})


class _TryElsewhere(Exception):
    """This replica failed before anything reached the client."""

    def __init__(self, reason: str, response: web.Response | None = None) -> None:
        super().__init__(reason)
        self.response = response


async def forward(request: web.Request, body: bytes | None, route: Route,
                  streamed: bool = False) -> web.StreamResponse:
    """``streamed``: the request asked for a stream, so each wait on the replica is bounded
    by ``stream_idle_timeout``."""
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
            return await _attempt(request, state, replica, body, streamed)
        except _TryElsewhere as exc:
            failure = exc
        finally:
            replica.in_flight -= 1
    assert failure is not None
    if failure.response is not None:  # every replica answered "not now": the last one's answer
        return failure.response
    state.metrics.failures.labels("502").inc()
    return error_responses.upstream_failed(len(attempts), str(failure))


def forward_headers(headers: CIMultiDict[str] | Any, peer: str | None,
                    trusted: bool = False) -> CIMultiDict[str]:
    """The request's headers for the replica, with the client's address appended to
    ``X-Forwarded-For``. The chain it came with is kept only from a ``trusted`` peer (a proxy
    in ``--forwarded-allow-ips``): from anyone else it is the client's own claim, which a
    replica that trusts the router must not read."""
    out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)
    if not trusted:
        out.popall(X_FORWARDED_FOR, None)
        out.popall(FORWARDED, None)
    if peer:
        earlier = ", ".join(out.popall(X_FORWARDED_FOR, ()))
        out[X_FORWARDED_FOR] = f"{earlier}, {peer}" if earlier else peer
    # A long prefill's silence then carries keep-alive comments that the idle timer sees
    # (the router passes whole events on, never the comments).
    out[HEADER_KEEPALIVE] = "1"
    return out


def _response_headers(upstream: aiohttp.ClientResponse, replica: Replica) -> CIMultiDict[str]:
    out = CIMultiDict((k, v) for k, v in upstream.headers.items()
                      if k.lower() not in _HOP_BY_HOP and not k.lower().startswith(_HINT_PREFIX))
    out[REPLICA_HEADER] = replica.url
    return out


async def _attempt(request: web.Request, state: RouterState, replica: Replica,
                   body: bytes | None, streamed: bool) -> web.StreamResponse:
    upstream, first = await _until_ejected(
        replica, _open(request, state, replica, body, streamed))
    async with upstream:
        headers = _response_headers(upstream, replica)
        if upstream.content_type == "text/event-stream":
            return await relay(request, state, replica, upstream, first, headers)
        if upstream.status < 400:
            state.replicas.succeeded(replica)
        return web.Response(status=upstream.status, body=first, headers=headers)


async def _open(request: web.Request, state: RouterState, replica: Replica,
                body: bytes | None, streamed: bool) -> tuple[aiohttp.ClientResponse, bytes]:
    """The replica's response and its first bytes (a stream's first chunk, or the whole body
    of an answer that is not streamed): until then the request may still go elsewhere."""
    config = state.config
    silence = config.stream_idle_timeout if streamed else config.upstream_timeout
    timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout,
                                    sock_read=silence)
    headers = forward_headers(request.headers, request.remote,
                              state.proxies.trusts(request.remote or ""))
    state.tracing.inject(headers)
    upstream: aiohttp.ClientResponse | None = None
    try:
        upstream = await state.session.request(
            request.method, replica.url + request.path_qs, data=body, headers=headers,
            timeout=timeout)
        hints = LoadHints.from_headers(upstream.headers)
        if hints is not None:
            replica.hints = hints
        if upstream.status == 429 or upstream.status >= 500:
            raise await _refusal(state, replica, upstream)
        if upstream.content_type == "text/event-stream":
            first = await upstream.content.readany()
            if not first:
                upstream.close()
                raise _failed(state, replica, "an event stream that ended before its first byte")
            return upstream, first
        return upstream, await upstream.read()
    except aiohttp.ClientConnectorError as exc:  # nothing listens there: down, not slow
        state.replicas.eject(replica, f"cannot connect: {exc!r}")
        raise _TryElsewhere(f"{replica.url}: {exc!r}") from exc
    except (TimeoutError, aiohttp.ClientError) as exc:
        if upstream is not None:
            upstream.close()
        raise _failed(state, replica, repr(exc),
                      silent=isinstance(exc, TimeoutError)) from exc
    except BaseException:
        if upstream is not None:
            upstream.close()
        raise


def _failed(state: RouterState, replica: Replica, reason: str,
            silent: bool = False) -> _TryElsewhere:
    state.replicas.failed(replica, reason, silent)
    return _TryElsewhere(f"{replica.url}: {reason}")


async def _until_ejected(replica: Replica, opening: Coroutine[Any, Any, T]) -> T:
    """``opening``'s result, unless the replica is ejected first (a health check found it
    hung): then the request has sent nothing to the client yet and tries elsewhere."""
    task = asyncio.current_task()
    assert task is not None
    replica.waiting.add(task)
    try:
        return await opening
    except asyncio.CancelledError:
        if not replica.was_cut_off(task):
            raise  # the client left
        raise _TryElsewhere(f"{replica.url} was ejected while the request waited on it"
                            ) from None
    finally:
        replica.waiting.discard(task)


async def _refusal(state: RouterState, replica: Replica,
                   upstream: aiohttp.ClientResponse) -> _TryElsewhere:
    """A 429 or 5xx: passed on only if no other replica answers; counted unless the replica
    is just full, and out of rotation at once while it drains."""
    status = upstream.status
    try:
        data = await upstream.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return _failed(state, replica, f"answered {status}, then {exc!r}")
    code = error_code(data)
    if code == DRAINING:
        state.replicas.eject(replica, "draining", silent=False)
    elif status >= 500 and code not in _FULL_CODES:
        state.replicas.failed(replica, f"answered {status}")
    answer = web.Response(status=status, body=data,
                          headers=_response_headers(upstream, replica))
    return _TryElsewhere(f"{replica.url} answered {status}", answer)
