"""The replicas the router knows: their health, their load, and how they are discovered.

A replica is ejected when a request to it fails to connect or its health check fails, and
comes back when ``/health`` answers 200 again. Its load is the router's own in-flight count
plus the load hints the replica sends on every response and on ``GET /load``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pagedserve.common.load_hints import LoadHints
from pagedserve.router.router_config import RouterConfig

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    in_flight: int = 0
    ejections: int = 0
    hints: LoadHints | None = None
    # Handlers waiting for this replica's first byte. Ejecting the replica cancels them and
    # moves them to ``cut_off``, where the handler finds why it was cancelled and tries the
    # next replica (a cancelled handler's own task, not a second task raced against an
    # event: that cost a task and an ``asyncio.wait`` per request).
    waiting: set[asyncio.Task[Any]] = field(default_factory=set)
    cut_off: set[asyncio.Task[Any]] = field(default_factory=set)

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

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy]

    def eject(self, replica: Replica, reason: str) -> None:
        if replica.healthy:
            logger.warning("router: ejecting %s: %s", replica.url, reason)
            replica.ejections += 1
        replica.healthy = False
        ejecting = asyncio.current_task()  # a request that failed here moves on by itself
        for task in replica.waiting - {ejecting}:
            replica.cut_off.add(task)
            task.cancel()
        replica.waiting.clear()

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
        try:
            async with session.get(replica.url + "/health", timeout=timeout) as response:
                ok = response.status == 200
                await response.read()
            if ok:
                async with session.get(replica.url + "/load", timeout=timeout) as response:
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
            self.eject(replica, reason)

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
