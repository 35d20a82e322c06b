"""The load-hint protocol between a pagedserve server and its clients.

Every pagedserve response carries these headers; ``GET /load`` returns the same values
(and the engine's limits) as JSON under the keys of ``LoadHints``. Other servers send
none, and clients then fall back to a fixed budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

HEADER_KV_USAGE = "X-PagedServe-KV-Usage"  # fraction of device KV blocks in use, 0..1
HEADER_NUM_WAITING = "X-PagedServe-Num-Waiting"  # requests waiting to be scheduled
HEADER_NUM_RUNNING = "X-PagedServe-Num-Running"  # requests in the running batch
HEADER_FREE_TOKENS = "X-PagedServe-Free-Tokens"  # KV token slots free right now
HEADER_PREEMPTIONS = "X-PagedServe-Num-Preemptions"  # cumulative preemptions since start


@dataclass(slots=True, frozen=True)
class LoadHints:
    kv_cache_usage: float
    num_waiting: int
    num_running: int
    free_token_capacity: int
    num_preemptions: int

    def to_headers(self) -> dict[str, str]:
        return {
            HEADER_KV_USAGE: f"{self.kv_cache_usage:.4f}",
            HEADER_NUM_WAITING: str(self.num_waiting),
            HEADER_NUM_RUNNING: str(self.num_running),
            HEADER_FREE_TOKENS: str(self.free_token_capacity),
            HEADER_PREEMPTIONS: str(self.num_preemptions),
        }

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> LoadHints | None:
        """The hints in a response's headers, or None when the server sent none."""
        try:
            return cls(
                kv_cache_usage=float(headers[HEADER_KV_USAGE]),
                num_waiting=int(headers[HEADER_NUM_WAITING]),
                num_running=int(headers[HEADER_NUM_RUNNING]),
                free_token_capacity=int(headers[HEADER_FREE_TOKENS]),
                num_preemptions=int(headers[HEADER_PREEMPTIONS]),
            )
        except (KeyError, ValueError):
            return None
