"""How one step's prefill tokens are split between tenants.

Admission alone (``fair_share.py``) does not make a step fair: the running requests are served
first, oldest first, and a tenant's running prefills (chunked) would take the whole step's
token budget, so another tenant's short prompt shares each step with their chunks, or waits
for the next one. While more than one tenant is live (has requests in the queues, or had one
finish a moment ago: ``tenant_activity.py``), each step therefore:

- keeps a token for every running sequence that decodes (decodes are never held back);
- hands the rest, the prefill pool, out by recent service: the tenant served least lately
  takes all it needs first, then the others in turn;
- bounds the pool, with N = ``max_shared_prefill_tokens`` and k tenants with prompt tokens
  to compute: the first may take up to k·N, and the step computes at most (k - 1)·N or what
  the first took, whichever is more (one tenant with prompts beside others that only decode
  or linger: N). One tenant's huge prompts then cannot make every step
  long for the others (the step's length is what a decoding or newly arrived request waits
  for): a tenant that arrives beside another's backlog has its prompt computed at once, in a
  step with little else in it (two tenants: the other gets what the prompt leaves of N), and
  two backlogged tenants take turns (the one served becomes the one served more). Ties go to
  the smaller demand.
- gives each tenant with prompt tokens at least a token for each sequence of its widest such
  request, so that every tenant's prefills move on however small the pool.

Within a tenant its requests take their allowance in arrival order (first come, first served).
With one tenant live nothing changes: no allowances, the step is as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pagedserve.server.engine.core.sequence import SequenceGroup, SequenceStatus

Tenant = str | None


def prefill_tokens(seq_group: SequenceGroup) -> int:
    """The tokens a request still has to compute when one of its sequences has a prompt (or
    recomputed tokens) to catch up on; zero for a decode, one token a sequence."""
    tokens = [seq.num_uncomputed_tokens for seq in seq_group.seqs
              if not seq.status.is_finished]
    return sum(tokens) if any(num > 1 for num in tokens) else 0


def _admissible_lines(waiting: list[SequenceGroup],
                      can_admit: Callable[[SequenceGroup], bool]) -> list[SequenceGroup]:
    """The waiting requests of the tenants whose oldest waiting request could start now."""
    admissible: dict[Tenant, bool] = {}
    for group in waiting:  # in arrival order: a tenant's first is its oldest
        if group.tenant not in admissible:
            admissible[group.tenant] = can_admit(group)
    return [group for group in waiting if admissible[group.tenant]]


def is_prefilling(seq_group: SequenceGroup) -> bool:
    return prefill_tokens(seq_group) > 0


def _num_unfinished(seq_group: SequenceGroup) -> int:
    return sum(not seq.status.is_finished for seq in seq_group.seqs)


class StepShares:
    """Prefill tokens each tenant may still compute in this step."""

    __slots__ = ("allowance",)

    def __init__(self, allowance: dict[Tenant, int]) -> None:
        self.allowance = allowance

    @classmethod
    def of(cls, running: list[SequenceGroup], swapped: list[SequenceGroup],
           waiting: list[SequenceGroup], lingering: Iterable[Tenant],
           can_admit: Callable[[SequenceGroup], bool],
           max_num_batched_tokens: int, max_shared_prefill_tokens: int | None,
           served: Callable[[Tenant], float],
           rank: Callable[[Tenant], tuple[int, int]]) -> StepShares | None:
        """The allowances for a step over the running, swapped and waiting requests, or None
        when one tenant (or none) is live. The ``lingering`` tenants (whose last
        request finished a moment ago) count as live, with nothing to prefill. ``served``
        is a tenant's recent prefill service; ties go to the smaller demand, then to the lower
        ``rank`` (admission's order).

        A tenant's waiting requests count only if the blocks its oldest needs are free
        (``can_admit``): a share kept for a request that cannot start would slow down the
        prefills whose end frees those blocks.
        """
        lingering = set(lingering)
        if len(lingering.union(group.tenant for group in (*running, *swapped, *waiting))) < 2:
            return None  # one tenant: no block checks either
        groups = [*running, *swapped, *_admissible_lines(waiting, can_admit)]
        if len(lingering.union(group.tenant for group in groups)) < 2:
            return None
        demand: dict[Tenant, int] = {}
        width: dict[Tenant, int] = {}
        for group in groups:
            tokens = prefill_tokens(group)
            if tokens:
                demand[group.tenant] = demand.get(group.tenant, 0) + tokens
                width[group.tenant] = max(width.get(group.tenant, 0), _num_unfinished(group))
        decodes = sum(group.num_seqs(SequenceStatus.RUNNING) for group in running
                      if not is_prefilling(group))
        pool = rest = max(0, max_num_batched_tokens - decodes)
        if max_shared_prefill_tokens is not None:
            pool = min(pool, max_shared_prefill_tokens * max(1, len(demand)))
            rest = min(rest, max_shared_prefill_tokens * (len(demand) - 1))
        order = sorted(demand, key=lambda tenant: (served(tenant), demand[tenant], *rank(tenant)))
        return cls(least_served_first(order, demand, width, pool, rest))

    def left(self, tenant: Tenant) -> int:
        return self.allowance.get(tenant, 0)

    def spend(self, tenant: Tenant, num_tokens: int) -> None:
        self.allowance[tenant] = self.left(tenant) - num_tokens


def least_served_first(order: list[Tenant], demand: dict[Tenant, int],
                       width: dict[Tenant, int], pool: int, rest: int) -> dict[Tenant, int]:
    """Grants: the tenants in ``order``, one after another, each take what they need
    (``demand``) of what is left: ``pool`` tokens for the first, then what it leaves of
    ``rest``. Each gets at least ``width`` tokens: a request's sequences advance together, a
    token each at least, and a smaller grant could hold every tenant's prefills back for ever
    (the first one's request may be unable to start)."""
    grants: dict[Tenant, int] = {}
    left = pool
    for index, tenant in enumerate(order):
        grants[tenant] = max(min(demand[tenant], left), width[tenant])
        left = max(0, (rest if index == 0 else left) - grants[tenant])
    return grants
