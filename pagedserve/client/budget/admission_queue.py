"""A fair waiting line in front of a budget.

Waiters are served strictly in ticket order: while the head cannot be admitted nobody behind
it is, so a large request is never starved by a stream of small ones that would each fit.
A retried request keeps its first ticket and so returns near the front. When the head is
held back only by time (a rate limit, an endpoint cooling down) a timer wakes the line;
otherwise whoever frees capacity calls ``wake``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

GrantT = TypeVar("GrantT")

# try_grant(tokens) -> (grant, None) when admitted now; (None, seconds) when admission is
# only a matter of time; (None, None) when it waits for capacity to be released.
TryGrant = Callable[[int], tuple[GrantT | None, float | None]]


@dataclass(order=True, slots=True)
class _Waiter(Generic[GrantT]):
    ticket: int
    tokens: int = field(compare=False)
    future: asyncio.Future[GrantT] = field(compare=False)


class AdmissionQueue(Generic[GrantT]):
    def __init__(
        self, try_grant: TryGrant[GrantT], abandon: Callable[[GrantT], None]
    ) -> None:
        """``abandon(grant)`` gives back a grant whose waiter was cancelled meanwhile."""
        self._try_grant = try_grant
        self._abandon = abandon
        self._heap: list[_Waiter[GrantT]] = []
        self._tickets = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def next_ticket(self) -> int:
        return next(self._tickets)

    async def wait(self, tokens: int, ticket: int | None = None) -> GrantT:
        """Wait for admission in ticket order (a fresh ticket when none is given)."""
        if ticket is None:
            ticket = self.next_ticket()
        if not self._heap or ticket < self._heap[0].ticket:
            grant, _ = self._try_grant(tokens)
            if grant is not None:
                return grant
        future: asyncio.Future[GrantT] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, _Waiter(ticket, tokens, future))
        self.wake()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._abandon(future.result())
            future.cancel()
            self.wake()  # the head may have left; whoever is next may fit
            raise

    def wake(self) -> None:
        """Admit waiters from the head while they fit."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._heap:
            head = self._heap[0]
            if head.future.done():
                heapq.heappop(self._heap)
                continue
            grant, delay = self._try_grant(head.tokens)
            if grant is None:
                if delay is not None:
                    loop = asyncio.get_running_loop()
                    self._timer = loop.call_later(max(delay, 0.0), self.wake)
                return
            heapq.heappop(self._heap)
            head.future.set_result(grant)
