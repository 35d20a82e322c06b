"""Each client's share of the server: connections and requests in flight per source address,
and per API key when keys are set.

One client must not be able to use up what everyone shares (the connection cap, the waiting
queue); over its share it gets 429 with Retry-After and a body that names the limit, while
the other clients go on. Behind a proxy every client has the proxy's address: there the
per-address caps bound the proxy, and the per-key caps are the ones that tell tenants apart.
"""

from __future__ import annotations

import asyncio

from pagedserve.common.errors import APIError
from pagedserve.common.http.json_errors import RATE_LIMIT

# A client over its share may retry as soon as one of its connections or requests ends.
CLIENT_RETRY_AFTER_S = 1


class ClientCounter:
    """How much of one resource each client holds, against a cap per client."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def try_acquire(self, client: str) -> bool:
        """Takes one for ``client``; False (taking nothing) when it already holds ``limit``."""
        held = self._counts.get(client, 0)
        if held >= self.limit:
            return False
        self._counts[client] = held + 1
        return True

    def release(self, client: str) -> None:
        held = self._counts[client] - 1
        if held:
            self._counts[client] = held
        else:
            del self._counts[client]  # forget clients that hold nothing: the table stays small

    def held(self, client: str) -> int:
        return self._counts.get(client, 0)

    def __len__(self) -> int:
        return len(self._counts)


class KeyConnections:
    """Open connections per API key. A connection's key is known only once a request on it
    presents one, so it counts against the key of its first such request, until it closes;
    later requests on it are not counted again."""

    def __init__(self, limit: int) -> None:
        self.per_key = ClientCounter(limit)
        self._key_of: dict[asyncio.BaseTransport, str] = {}

    def claim(self, transport: asyncio.BaseTransport | None, key: str) -> bool:
        """Counts ``transport`` against ``key`` unless it is counted already; False (counting
        nothing) when the key holds its limit."""
        if transport is None or transport in self._key_of:
            return True
        if not self.per_key.try_acquire(key):
            return False
        self._key_of[transport] = key
        return True

    def closed(self, transport: asyncio.BaseTransport) -> None:
        key = self._key_of.pop(transport, None)
        if key is not None:
            self.per_key.release(key)


def peer_host(transport: asyncio.BaseTransport) -> str:
    """The source address of a connection (empty for a socket without one)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return ""


def over_client_share(what: str, who: str, limit: int, flag: str) -> APIError:
    """429 for a client that holds ``limit`` of ``what`` already."""
    return APIError(
        f"Too many {what} {who}: the limit per client is {limit} ({flag}); retry once one of "
        f"them has finished.", status=429, type=RATE_LIMIT, code="client_limit_exceeded",
        headers={"Retry-After": str(CLIENT_RETRY_AFTER_S)})
