"""The adaptive budget's knobs (``AdaptiveConfig``) and its starting point and bounds for one
server (``plan_budget``), from the server's ``GET /load`` where it has one."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.client.adaptive.latency_target import LatencyTarget
from pagedserve.client.api.types import ServerLoad

# How far past the KV cache the token capacity may grow: reservations count max_tokens for
# every request, while most stop early, so the cache fills at well below the reserved total.
OVERCOMMIT_LIMIT = 4
# Reserving the whole cache would still preempt: each sequence's last block is part empty.
KV_SAFE_SHARE = 0.9
DEFAULT_INITIAL_CONCURRENCY = 16
DEFAULT_MAX_CONCURRENCY = 256  # without hints or a limit: the runner's default worker count


@dataclass(slots=True)
class AdaptiveConfig:
    """Knobs of the controller; None means "derive from the server's /load"."""

    initial_tokens: int | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    initial_concurrency: int | None = None
    decrease_factor: float = 0.5
    kv_usage_high: float = 0.9
    kv_usage_low: float = 0.8
    waiting_high: int | None = None
    interval_s: float = 0.25
    memory_s: float = 20.0
    target: LatencyTarget | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(f"decrease_factor must be in (0, 1), got {self.decrease_factor}")
        if not 0.0 < self.kv_usage_high <= 1.0:
            raise ValueError(f"kv_usage_high must be in (0, 1], got {self.kv_usage_high}")
        if not 0.0 < self.kv_usage_low < self.kv_usage_high:
            raise ValueError(f"kv_usage_low must be in (0, kv_usage_high), got "
                             f"{self.kv_usage_low}")
        for name in ("initial_tokens", "min_tokens", "max_tokens", "initial_concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.waiting_high is not None and self.waiting_high < 0:
            raise ValueError(f"waiting_high must be at least 0, got {self.waiting_high}")
        for name in ("interval_s", "memory_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(slots=True, frozen=True)
class BudgetPlan:
    """Starting point and bounds of an adaptive budget for one server."""

    initial_tokens: int
    min_tokens: int
    max_tokens: int
    initial_concurrency: int
    max_concurrency: int
    waiting_high: int
    kv_tokens: int | None  # the server's KV size; None without hints (capacity stays fixed)


def plan_budget(
    config: AdaptiveConfig,
    load: ServerLoad | None,
    fallback_tokens: int,
    max_concurrency: int | None,
) -> BudgetPlan:
    """Bounds from the server's ``/load`` where it has one, else a fixed ``fallback_tokens``."""
    kv_tokens = load.total_kv_tokens if load is not None else None
    safe = int(KV_SAFE_SHARE * kv_tokens) if kv_tokens else None
    initial = config.initial_tokens or safe or fallback_tokens
    ceiling = config.max_tokens or (OVERCOMMIT_LIMIT * kv_tokens if kv_tokens else initial)
    initial = min(initial, ceiling)
    floor = min(config.min_tokens or max(1, initial // 16), initial)
    seqs = load.max_num_seqs if load is not None else None
    if max_concurrency is None:
        # One batch running and the next one queued; without hints, the runner's workers.
        max_concurrency = 2 * seqs if seqs else DEFAULT_MAX_CONCURRENCY
    if kv_tokens:
        start = config.initial_concurrency or _start_from_best(load)
    else:
        start = config.initial_concurrency or max_concurrency
    waiting_high = config.waiting_high
    if waiting_high is None:
        waiting_high = max(2, seqs // 16) if seqs else 2
    return BudgetPlan(
        initial_tokens=initial,
        min_tokens=floor,
        max_tokens=ceiling,
        initial_concurrency=min(start, max_concurrency),
        max_concurrency=max_concurrency,
        waiting_high=waiting_high,
        kv_tokens=kv_tokens or None,
    )


def _start_from_best(load: ServerLoad) -> int:
    """Where the search starts: what is left of the running count at which the server
    measured its most tokens per second (what others run and queue there is theirs), and
    never under the default, from which a cold server's search starts."""
    best = load.best_running or 0
    return max(DEFAULT_INITIAL_CONCURRENCY, best - load.num_running - load.num_waiting)
