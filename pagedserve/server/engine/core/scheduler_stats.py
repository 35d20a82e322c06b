"""The scheduler's usage snapshots, as /metrics and /load report them: token occupancy,
preemptions and the queues (``SchedulerStats``), with the KV pools' usage (``kv_usage.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.server.engine.core.kv_usage import KVCacheUsage
from pagedserve.server.engine.core.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from pagedserve.server.engine.core.scheduler import Scheduler


@dataclass(slots=True, frozen=True)
class TokenOccupancy:
    """Slots of the distinct blocks in some block tables, and how many hold a real token."""

    num_token_slots: int
    num_real_tokens: int

    @property
    def utilization(self) -> float:
        """Fraction of allocated slots holding real tokens (1.0 when nothing is allocated)."""
        if self.num_token_slots == 0:
            return 1.0
        return self.num_real_tokens / self.num_token_slots

    @classmethod
    def of(cls, seqs: Iterable[Sequence], block_size: int) -> TokenOccupancy:
        """Counts each physical block once, however many sequences share it.

        A shared block sits at the same index in every table that holds it, so it is full if
        any of them fills it, and otherwise holds the most tokens any of them put there.
        """
        blocks: set[int] = set()
        full: set[int] = set()
        partial: dict[int, int] = {}
        for seq in seqs:
            table = seq.block_table
            blocks.update(table)
            num_full = min(seq.num_tokens // block_size, len(table))
            full.update(table[:num_full])
            remainder = seq.num_tokens - num_full * block_size
            if num_full < len(table) and remainder > 0:
                block_id = table[num_full]
                partial[block_id] = max(partial.get(block_id, 0), remainder)
        real = len(full) * block_size + sum(
            count for block_id, count in partial.items() if block_id not in full)
        return cls(num_token_slots=len(blocks) * block_size, num_real_tokens=real)


@dataclass(slots=True)
class PreemptionStats:
    """Preemptions since start, by how the victim's KV was given up."""

    num_recompute: int = 0
    num_swap: int = 0

    @property
    def total(self) -> int:
        return self.num_recompute + self.num_swap


@dataclass(slots=True, frozen=True)
class SchedulerStats:
    """A snapshot for /metrics and the load hints (names match ``pagedserve.common.load_hints``)."""

    num_waiting: int
    num_running: int
    num_swapped: int
    num_running_seqs: int
    kv: KVCacheUsage
    occupancy: TokenOccupancy | None  # None unless asked for: it scans the block tables
    num_preemptions_recompute: int
    num_preemptions_swap: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int

    @classmethod
    def of(cls, scheduler: Scheduler, with_occupancy: bool = True) -> SchedulerStats:
        manager = scheduler.block_manager
        device_seqs = [seq for group in scheduler.running
                       for seq in group.get_seqs(SequenceStatus.RUNNING)]
        occupancy = TokenOccupancy.of(device_seqs, manager.block_size) if with_occupancy \
            else None
        return cls(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            num_swapped=len(scheduler.swapped),
            num_running_seqs=len(device_seqs),
            kv=manager.usage(),
            occupancy=occupancy,
            num_preemptions_recompute=scheduler.preemption_stats.num_recompute,
            num_preemptions_swap=scheduler.preemption_stats.num_swap,
            prefix_cache_queried_tokens=manager.prefix_cache_stats.num_queried_tokens,
            prefix_cache_hit_tokens=manager.prefix_cache_stats.num_hit_tokens,
        )

    @property
    def kv_cache_usage(self) -> float:
        return self.kv.kv_cache_usage

    @property
    def kv_utilization(self) -> float:
        if self.occupancy is None:
            raise ValueError("this snapshot was taken without occupancy (stats(True) adds it)")
        return self.occupancy.utilization

    @property
    def free_token_capacity(self) -> int:
        return self.kv.free_token_capacity

    @property
    def num_preemptions(self) -> int:
        return self.num_preemptions_recompute + self.num_preemptions_swap

    @property
    def prefix_cache_hit_rate(self) -> float:
        if self.prefix_cache_queried_tokens == 0:
            return 0.0
        return self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens

