"""Adaptive in-flight budget: additive increase, multiplicative decrease (as TCP's window).

Against a pagedserve server the goal is a KV cache that stays full without preemption. Each
completed request grows the budget by ``increase_per_window × tokens / capacity``, so a full
budget's worth of completed work adds ``increase_per_window`` tokens, while the server says
there is room (KV usage under ``kv_usage_high``, no more than ``waiting_high`` requests
queued). A 429, a rise in the server's preemption count or a queue growing past
``waiting_high`` multiplies the budget by ``decrease_factor``.

Signals come back late: requests sent under the old, larger budget keep reporting congestion
after the cut. So each decrease starts a new epoch, a request remembers the epoch it was sent
in, and only a request sent in the current epoch can cut again, once per window as in TCP.
Without load hints (another server) only 429s move the budget, which then never grows past
its starting size.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pagedserve.client.budget import TokenBudget
from pagedserve.client.types import ServerLoad
from pagedserve.common.load_hints import LoadHints

# How far past the KV cache the budget may grow: reservations count max_tokens for every
# request, while most stop early, so the cache fills at well below the reserved total.
OVERCOMMIT_LIMIT = 4
_HISTORY = 1024


@dataclass(slots=True)
class AdaptiveConfig:
    """Knobs of the controller; None means "derive from the server's /load"."""

    initial_tokens: int | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    increase_per_window: int | None = None
    decrease_factor: float = 0.5
    kv_usage_high: float = 0.95
    waiting_high: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(f"decrease_factor must be in (0, 1), got {self.decrease_factor}")
        if not 0.0 < self.kv_usage_high <= 1.0:
            raise ValueError(f"kv_usage_high must be in (0, 1], got {self.kv_usage_high}")
        for name in ("initial_tokens", "min_tokens", "max_tokens", "increase_per_window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.waiting_high is not None and self.waiting_high < 0:
            raise ValueError(f"waiting_high must be at least 0, got {self.waiting_high}")


@dataclass(slots=True, frozen=True)
class BudgetPlan:
    """Starting point and bounds of an adaptive budget for one server."""

    initial_tokens: int
    min_tokens: int
    max_tokens: int
    max_concurrency: int | None
    increase_per_window: int
    waiting_high: int | None


def plan_budget(
    config: AdaptiveConfig,
    load: ServerLoad | None,
    fallback_tokens: int,
    max_concurrency: int | None,
) -> BudgetPlan:
    """Bounds from the server's ``/load`` where it has one, else a fixed ``fallback_tokens``."""
    kv_tokens = load.total_kv_tokens if load is not None else None
    initial = config.initial_tokens or kv_tokens or fallback_tokens
    ceiling = config.max_tokens or (OVERCOMMIT_LIMIT * kv_tokens if kv_tokens else initial)
    initial = min(initial, ceiling)
    floor = min(config.min_tokens or max(1, initial // 16), initial)
    if max_concurrency is None and load is not None and load.max_num_seqs:
        max_concurrency = 2 * load.max_num_seqs  # one batch running, the next one queued
    waiting_high = config.waiting_high
    if waiting_high is None and load is not None and load.max_num_seqs:
        waiting_high = max(1, load.max_num_seqs // 4)
    return BudgetPlan(
        initial_tokens=initial,
        min_tokens=floor,
        max_tokens=ceiling,
        max_concurrency=max_concurrency,
        increase_per_window=config.increase_per_window or max(1, initial // 8),
        waiting_high=waiting_high,
    )


class AdaptiveBudget:
    """Moves one ``TokenBudget``'s capacity between the plan's bounds."""

    def __init__(self, budget: TokenBudget, plan: BudgetPlan, config: AdaptiveConfig) -> None:
        self.budget = budget
        self.plan = plan
        self.config = config
        self.epoch = 0
        self.history: deque[tuple[str, int]] = deque([("start", budget.capacity)], _HISTORY)
        self._credit = 0.0
        self._preemptions_seen: int | None = None
        self._last_waiting = 0

    @property
    def capacity(self) -> int:
        return self.budget.capacity

    def on_success(self, sent_epoch: int, tokens: int, hints: LoadHints | None) -> None:
        """A request sent in ``sent_epoch`` finished, holding ``tokens``; ``hints`` came with
        its answer (None from servers that send none)."""
        if hints is None:
            self._grow(tokens)
            return
        reason = self._congestion(hints)
        if reason is not None:
            self._cut(sent_epoch, reason)
        elif not self._server_full(hints):
            self._grow(tokens)

    def on_rate_limited(self, sent_epoch: int) -> None:
        """The server answered 429 to a request sent in ``sent_epoch``."""
        self._cut(sent_epoch, "rate-limited")

    def _congestion(self, hints: LoadHints) -> str | None:
        previous_preemptions, previous_waiting = self._preemptions_seen, self._last_waiting
        self._preemptions_seen = max(previous_preemptions or 0, hints.num_preemptions)
        self._last_waiting = hints.num_waiting
        if previous_preemptions is not None and hints.num_preemptions > previous_preemptions:
            return "preemption"
        high = self.plan.waiting_high
        if high is not None and hints.num_waiting > high and hints.num_waiting > previous_waiting:
            return "queue"
        return None

    def _server_full(self, hints: LoadHints) -> bool:
        high = self.plan.waiting_high
        queued = high is not None and hints.num_waiting > high
        return queued or hints.kv_cache_usage >= self.config.kv_usage_high

    def _grow(self, tokens: int) -> None:
        if self.capacity >= self.plan.max_tokens:
            return
        self._credit += self.plan.increase_per_window * tokens / self.capacity
        step = int(self._credit)
        if step:
            self._credit -= step
            self._resize(self.capacity + step, "increase")

    def _cut(self, sent_epoch: int, reason: str) -> None:
        if sent_epoch < self.epoch:
            return
        self.epoch += 1
        self._credit = 0.0
        self._resize(int(self.capacity * self.config.decrease_factor), reason)

    def _resize(self, capacity: int, reason: str) -> None:
        bounded = max(self.plan.min_tokens, min(capacity, self.plan.max_tokens))
        if bounded != self.capacity:
            self.budget.resize(bounded)
            self.history.append((reason, bounded))
