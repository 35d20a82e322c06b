"""Who gets in: the API-key check, the drain gate, each client's share of requests in
flight, and a count of what is in flight.

``/health`` and ``/metrics`` stay open (load balancers and Prometheus hold no key, and both
must see a draining server); they are all that a probe-only connection (one past the
connection cap, or on the health port) may ask for. The web page's own files need no key (the
page asks for one); everything else, its ``/engine/state`` included, needs a bearer token when
keys are set, gets 503 once the server is draining, and 429 when its source address or its
key already has ``max_requests_per_client`` in flight, or when it comes on a new connection
and its key already holds ``max_connections_per_client``; the requests already admitted run on,
and the in-flight count tells the shutdown when they are done. A request's source address is
its peer's, or the client a trusted proxy names (``common/http/forwarded.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from pagedserve.common.errors import APIError
from pagedserve.common.http.client_limits import (
    ClientCounter,
    KeyConnections,
    over_client_share,
)
from pagedserve.common.http.connection_guard import OPEN_PATHS, serve_probe
from pagedserve.common.http.forwarded import TrustedProxies
from pagedserve.server.api.http.api_errors import (
    INVALID_REQUEST,
    invalid_request,
    shutting_down,
)
from pagedserve.server.api.http.limits import ServerLimits
from pagedserve.server.api.web.paths import is_page_path

# The request's tenant (``key:N`` for the N-th API key, else ``addr:`` and its source
# address), which the engine schedules fairly against the others.
TENANT = web.RequestKey("tenant", str)


def _unauthorized(message: str) -> APIError:
    return APIError(message, status=401, type=INVALID_REQUEST, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


class Admission:
    def __init__(self, api_key: str | list[str] | None, limits: ServerLimits,
                 proxies: TrustedProxies | None = None) -> None:
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self._api_keys = [key.encode() for key in keys]
        self.per_address = ClientCounter(limits.max_requests_per_client)
        self.per_key = ClientCounter(limits.max_requests_per_client)
        self.proxies = TrustedProxies() if proxies is None else proxies
        # With keys, each key's share of connections too (the guard tells when they close).
        self.key_connections = KeyConnections(limits.max_connections_per_client)
        # Connections that may ask only for OPEN_PATHS, each with the error for anything else
        # (filled by the connection guards).
        self.probe_only: dict[Any, Callable[[], APIError]] = {}
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def middleware(self) -> Any:
        """This gate as an aiohttp middleware."""

        @web.middleware
        async def admission_middleware(request: web.Request,
                                       handler: Handler) -> web.StreamResponse:
            return await self._admit(request, handler)

        return admission_middleware

    async def _admit(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = self.probe_only.get(request.transport)
        if refusal is not None:
            return await serve_probe(request, handler, refusal)
        if request.path in OPEN_PATHS:
            return await handler(request)
        # The page's own files hold no secret: it loads without a key and then asks for one.
        key = None if is_page_path(request.path) else self._check_api_key(request)
        if self.draining:
            raise shutting_down()
        address = self.proxies.client_address(request)
        if key is not None:
            self._claim_connection(request, key)
        request[TENANT] = f"key:{key}" if key is not None else f"addr:{address}"
        with self._client_share(address, key):
            self._in_flight += 1
            self._idle.clear()
            try:
                return await handler(request)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

    def _claim_connection(self, request: web.Request, key: int) -> None:
        # A trusted proxy's connections carry many keys' requests: they count for none.
        if self.proxies.trusts(request.remote or ""):
            return
        if not self.key_connections.claim(request.transport, str(key)):
            error = over_client_share("connections", "open with this API key",
                                      self.key_connections.per_key.limit,
                                      "--max-connections-per-client")
            error.close_connection = True  # the answer frees the connection it came on
            raise error

    @contextlib.contextmanager
    def _client_share(self, address: str, key: int | None) -> Iterator[None]:
        if not self.per_address.try_acquire(address):
            raise over_client_share("requests in flight", f"from {address or 'this client'}",
                                    self.per_address.limit, "--max-requests-per-client")
        if key is not None and not self.per_key.try_acquire(str(key)):
            self.per_address.release(address)
            raise over_client_share("requests in flight", "with this API key",
                                    self.per_key.limit, "--max-requests-per-client")
        try:
            yield
        finally:
            self.per_address.release(address)
            if key is not None:
                self.per_key.release(str(key))

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing admitted is in flight; False if ``timeout`` seconds pass first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _check_api_key(self, request: web.Request) -> int | None:
        """The index of the key the request presents; None when no keys are set."""
        if not self._api_keys:
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized(
                "You didn't provide an API key: send it in the Authorization header as "
                "'Bearer YOUR_KEY'."
            )
        try:
            presented = token.strip().encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 (aiohttp keeps them escaped)
            raise invalid_request("The Authorization header must be valid UTF-8.",
                                  param=None) from None
        # Every key is compared, so the time taken does not tell which one nearly matched.
        matches = [hmac.compare_digest(presented, key) for key in self._api_keys]
        if not any(matches):
            raise _unauthorized("Incorrect API key provided.")
        return matches.index(True)


ADMISSION_KEY = web.AppKey("admission", Admission)
