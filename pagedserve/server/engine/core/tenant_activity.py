"""Which tenants are live, and how much prefill each was served lately.

Two facts about each tenant that a step's prefill split (``step_shares.py``) needs and that
outlast a single step:

- **Recent service**: the prompt tokens computed for the tenant's requests, decayed by
  ``DECAY`` each step (a deficit counter over the last few dozen steps). The tenant with the
  least recent service is served first, so a tenant that arrives beside another's backlog
  gets its prompt computed at once, while two backlogged tenants take turns: whichever is
  served becomes the one served more.
- **Liveness by time**: a tenant whose last request finished less than ``linger_s`` seconds
  ago still counts as live (with nothing to compute). A client that sends one request after
  another has nothing live between two of them; counting it keeps the steps short, so that
  its next request does not arrive during a long step of another tenant's prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput

Tenant = str | None

# Per step: a token served 8 steps ago counts half, 64 steps ago 1/256.
DECAY = 0.5 ** (1 / 8)
_FORGET_BELOW = 0.5  # a decayed counter below this is dropped: the table stays small


class TenantActivity:
    """Decayed prefill service per tenant, and when each tenant's last request finished."""

    __slots__ = ("_clock", "_finished_at", "linger_s", "recent")

    def __init__(self, linger_s: float, clock: Callable[[], float]) -> None:
        self.linger_s = linger_s
        self.recent: dict[Tenant, float] = {}
        self._finished_at: dict[Tenant, float] = {}
        self._clock = clock

    def finished(self, tenant: Tenant) -> None:
        """One of ``tenant``'s requests finished (or was aborted) now."""
        self._finished_at[tenant] = self._clock()

    def lingering(self) -> Iterable[Tenant]:
        """The tenants whose last request finished less than ``linger_s`` ago."""
        if not self._finished_at:
            return ()
        now = self._clock()
        self._finished_at = {tenant: at for tenant, at in self._finished_at.items()
                             if now - at < self.linger_s}
        return self._finished_at.keys()

    def served(self, tenant: Tenant) -> float:
        return self.recent.get(tenant, 0.0)

    def record(self, output: SchedulerOutput) -> None:
        """Decays every counter by a step and adds the step's prompt tokens (every chunk that
        does not just decode one token) to their tenants."""
        recent = {tenant: served * DECAY for tenant, served in self.recent.items()
                  if served * DECAY >= _FORGET_BELOW}
        for item in output.scheduled:
            if item.num_new_tokens > 1 or item.num_prompt_tokens:
                tenant = item.seq_group.tenant
                recent[tenant] = recent.get(tenant, 0.0) + item.num_new_tokens
        self.recent = recent
