"""Which waiting request the scheduler admits next: fair between tenants, first come first
served within one.

Each tenant (an API key, a client; None for all the requests that name none) has a counter
of the prompt tokens admitted for it, a virtual token counter as in VTC (Sheng et al.,
"Fairness in Serving Large Language Models", OSDI 2024). The next request admitted is the
oldest of the tenant with the lowest counter; ties go to the tenant served least recently
(round robin), then to the oldest request. A tenant that starts waiting is lifted to the
lowest counter among the tenants waiting, so that time spent idle is no credit to spend in a
burst; it wins the tie with them, so its first request goes next. One request's many
prompts are many engine requests of one tenant, so they are admitted a few at a time between
the other tenants' requests, and one tenant's huge request no longer holds back everyone
else's.

With one tenant waiting this is FCFS, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pagedserve.server.engine.core.sequence import SequenceGroup


class TenantShares:
    """The counters; only tenants with requests waiting keep one."""

    def __init__(self) -> None:
        self.served: dict[str | None, int] = {}
        self._last_turn: dict[str | None, int] = {}  # when each tenant was last admitted
        self._turns = 0

    def order(self, waiting: list[SequenceGroup],
              arrival: Callable[[SequenceGroup], int]) -> WaitingOrder:
        """The admission order over ``waiting`` (kept in arrival order) for one step."""
        return WaitingOrder(self, waiting, arrival)

    def charge(self, seq_group: SequenceGroup) -> None:
        """Counts an admitted request's tokens to compute against its tenant."""
        tokens = sum(seq.num_uncomputed_tokens for seq in seq_group.seqs)
        self.served[seq_group.tenant] = self.served.get(seq_group.tenant, 0) + tokens
        self._turns += 1
        self._last_turn[seq_group.tenant] = self._turns

    def rank(self, tenant: str | None) -> tuple[int, int]:
        """Lower goes first: the tokens admitted, then the last turn (-1: never)."""
        return self.served.get(tenant, 0), self._last_turn.get(tenant, -1)

    def _lift(self, tenants: list[str | None]) -> None:
        known = [self.served[t] for t in tenants if t in self.served]
        floor = min(known, default=0)
        # Tenants no longer waiting are forgotten: the table stays as small as the queue.
        self.served = {t: max(self.served.get(t, floor), floor) for t in tenants}
        self._last_turn = {t: self._last_turn[t] for t in tenants if t in self._last_turn}


class WaitingOrder:
    """The waiting requests of one step, one FCFS line per tenant."""

    def __init__(self, shares: TenantShares, waiting: list[SequenceGroup],
                 arrival: Callable[[SequenceGroup], int]) -> None:
        self._shares = shares
        self._arrival = arrival
        self._lines: dict[str | None, deque[SequenceGroup]] = {}
        for seq_group in waiting:
            self._lines.setdefault(seq_group.tenant, deque()).append(seq_group)
        shares._lift(list(self._lines))

    def __bool__(self) -> bool:
        return bool(self._lines)

    def next(self) -> SequenceGroup:
        """The request to admit next (the queue must not be empty)."""
        if len(self._lines) == 1:
            return next(iter(self._lines.values()))[0]
        rank = self._shares.rank
        tenant = min(self._lines, key=lambda t: (*rank(t), self._arrival(self._lines[t][0])))
        return self._lines[tenant][0]

    def remove(self, seq_group: SequenceGroup) -> None:
        """``seq_group`` (a line's head) left the queue: admitted or ignored."""
        line = self._lines[seq_group.tenant]
        line.popleft()
        if not line:
            del self._lines[seq_group.tenant]

    def drop_tenant(self, tenant: str | None) -> None:
        """``tenant`` admits no more requests in this step (its prefill share is spent)."""
        del self._lines[tenant]
