"""What an endpoint's load hints said between two decisions of its adaptive budget."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.common.load_hints import LoadHints


@dataclass(slots=True)
class HintInterval:
    """What the hints said since the last decision."""

    samples: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_peak: float = 0.0
    kv_per_reserved: float = 0.0  # the most KV held per reserved token
    window_full: bool = False
    tokens_full: bool = False
    projected: bool = False  # the server published its projected KV peak
    first_running: int = 0
    last_running: int = 0

    def add(self, hints: LoadHints, window_full: bool, tokens_full: bool,
            kv_per_reserved: float) -> None:
        if self.samples == 0:
            self.first_running = hints.num_running
        self.last_running = hints.num_running
        self.samples += 1
        self.running += hints.num_running
        self.waiting += hints.num_waiting
        self.kv_peak = max(self.kv_peak, hints.kv_cache_usage)
        self.kv_per_reserved = max(self.kv_per_reserved, kv_per_reserved)
        self.window_full |= window_full
        self.tokens_full |= tokens_full
        self.projected |= hints.kv_projected_usage is not None
