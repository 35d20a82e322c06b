"""Who gets in: the API-key check and the drain gate, and a count of what is in flight.

``/health`` and ``/metrics`` stay open (load balancers and Prometheus hold no key, and both
must see a draining server). Everything else needs the bearer token when a key is set and
gets 503 once the server is draining; the requests already admitted run on, and the
in-flight count tells the shutdown when they are done.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from aiohttp import web

from pagedserve.server.api.errors import (
    INVALID_REQUEST,
    APIError,
    invalid_request,
    shutting_down,
)

OPEN_PATHS = frozenset({"/health", "/metrics"})


def _unauthorized(message: str) -> APIError:
    return APIError(message, status=401, type=INVALID_REQUEST, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


class Admission:
    def __init__(self, api_key: str | None) -> None:
        self._api_key = api_key.encode() if api_key is not None else None
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
                                       handler: Any) -> web.StreamResponse:
            return await self._admit(request, handler)

        return admission_middleware

    async def _admit(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        self._check_api_key(request)
        if self.draining:
            raise shutting_down()
        self._in_flight += 1
        self._idle.clear()
        try:
            return await handler(request)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing admitted is in flight; False if ``timeout`` seconds pass first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _check_api_key(self, request: web.Request) -> None:
        if self._api_key is None:
            return
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
        if not hmac.compare_digest(presented, self._api_key):
            raise _unauthorized("Incorrect API key provided.")
