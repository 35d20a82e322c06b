"""The replicas the router knows: their health, their load, and how they are discovered.

A replica is ejected when a request cannot connect to it, when its health check fails, when
it says it is draining, or after ``failures_to_eject`` failures in a row (a 5xx, a reset, a
timeout, a stream that stalled or ended cut short); it comes back when ``/health`` answers 200
again, and a success clears its count. An ejection for silence (a health check that failed,
a replica that cannot be connected to, a timeout or a stalled stream as the last failure)
moves the requests still waiting for its first byte to another replica and ends its open
streams with an error event at once: they hang with it. Otherwise (a draining replica, 5xx
answers, resets) its requests run on to their end, each under its own timeouts. Its load
is the router's own in-flight count plus the load hints the replica sends on every response
and on ``GET /load``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from pagedserve.common.load_hints import LoadHints
from pagedserve.router.router_config import RouterConfig

logger = logging.getLogger(__name__)

# The code of a replica's 503 while it drains: out of rotation, its requests left to finish.
DRAINING = "server_draining"


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    in_flight: int = 0
    ejections: int = 0
    failures: int = 0  # in a row: a success clears it
    hints: LoadHints | None = None
    # Handlers waiting for this replica's first byte, and those streaming from it. Ejecting
    # the replica cancels them and moves them to ``cut_off``, where the handler finds why it
    # was cancelled: a waiting one tries the next replica, a streaming one ends its stream
    # with an error event (a cancelled handler's own task, not a second task raced against an
    # event: that cost a task and an ``asyncio.wait`` per request).
    waiting: set[asyncio.Task[Any]] = field(default_factory=set)
    streaming: set[asyncio.Task[Any]] = field(default_factory=set)
    cut_off: set[asyncio.Task[Any]] = field(default_factory=set)

    def was_cut_off(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task``'s cancellation was this replica's ejection (then it is taken
        back, unless the client left in the same moment) rather than its client leaving."""
        if task not in self.cut_off:
            return False
        self.cut_off.discard(task)
        # The client may have left in the same moment: its cancellation still counts.
        return not (sys.version_info >= (3, 11) and task.uncancel())

    def saturated(self, config: RouterConfig) -> bool:
        """Whether the replica's own hints say it cannot take more work now."""
        hints = self.hints
        if hints is None:
            return False
        return hints.num_waiting >= config.max_waiting or (
            hints.kv_cache_usage >= config.max_kv_usage)

    def load(self) -> tuple[int, int, float]:
        """Ordering for least-load: in flight here, then waiting and KV use at the replica."""
        waiting = self.hints.num_waiting if self.hints else 0
        usage = self.hints.kv_cache_usage if self.hints else 0.0
        return self.in_flight, waiting, usage


class ReplicaSet:
    """Every known replica by URL, in the order they were added."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.replicas: dict[str, Replica] = {url: Replica(url) for url in config.replicas}
        # /load needs the replicas' API key, when they have one (/health does not).
        self._auth_headers = ({"Authorization": f"Bearer {config.replica_api_key}"}
                              if config.replica_api_key else None)

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy]

    def eject(self, replica: Replica, reason: str, silent: bool = True) -> None:
        """Out of rotation until ``/health`` answers 200; when it fell ``silent`` its waiting
        requests move on and its streams end."""
        if replica.healthy:
            logger.warning("router: ejecting %s: %s", replica.url, reason)
            replica.ejections += 1
        replica.healthy = False
        if not silent:
            return
        ejecting = asyncio.current_task()  # a request that failed here moves on by itself
        for task in (replica.waiting | replica.streaming) - {ejecting}:
            replica.cut_off.add(task)
            task.cancel()
        replica.waiting.clear()
        replica.streaming.clear()

    def failed(self, replica: Replica, reason: str, silent: bool = False) -> None:
        """One more failure in a row (``silent``: a timeout); the ``failures_to_eject``-th
        ejects the replica."""
        replica.failures += 1
        if replica.failures >= self.config.failures_to_eject:
            self.eject(replica, f"{replica.failures} failures in a row, the last: {reason}",
                       silent)
        else:
            logger.warning("router: %s failed (%d in a row): %s", replica.url,
                           replica.failures, reason)

    @staticmethod
    def succeeded(replica: Replica) -> None:
        replica.failures = 0

    def admit(self, replica: Replica) -> None:
        if not replica.healthy:
            logger.info("router: %s is healthy again", replica.url)
            replica.healthy = True

    def replace(self, urls: list[str]) -> bool:
        """Sets the replicas to ``urls`` (from DNS), keeping the state of those that stay."""
        if set(urls) == set(self.replicas):
            return False
        self.replicas = {url: self.replicas.get(url) or Replica(url) for url in urls}
        return True

    async def check(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        """One health check: ``/health`` decides health, ``/load`` refreshes the hints."""
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout)
        headers = self._auth_headers
        draining = False
        try:
            async with session.get(replica.url + "/health", timeout=timeout) as response:
                ok = response.status == 200
                draining = error_code(await response.read()) == DRAINING
            if ok:
                async with session.get(replica.url + "/load", timeout=timeout,
                                       headers=headers) as response:
                    if response.status == 200:
                        replica.hints = LoadHints.from_json(await response.json()) or \
                            replica.hints
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            ok = False
            reason = f"health check failed: {exc!r}"
        else:
            reason = f"/health answered {response.status}"
        if ok:
            self.admit(replica)
        else:
            self.eject(replica, reason, silent=not draining)

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self.check(session, r) for r in list(self.replicas.values())))


async def resolve(name: str) -> list[str]:
    """Every address ``HOST:PORT`` resolves to, as replica URLs (sorted, no duplicates)."""
    host, _, port = name.rpartition(":")
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, int(port), type=socket.SOCK_STREAM)
    urls = set()
    for family, _type, _proto, _name, address in infos:
        ip = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
        urls.add(f"http://{ip}:{port}")
    return sorted(urls)


def error_code(body: bytes) -> str | None:
    """The ``error.code`` of an OpenAI-shaped error body; None for any other body."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None
