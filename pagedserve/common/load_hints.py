"""The load-hint protocol between a pagedserve server and its clients.

Every pagedserve response carries these headers; ``GET /load`` returns the same values
(and the engine's limits) as JSON under the keys of ``LoadHints``. Other servers send
none, and clients then fall back to a fixed budget. ``step_ms``, ``generated_tokens`` and
``kv_projected_usage`` are newer than the rest: a server that sends the five older headers
but not these still counts as sending hints, with those fields None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

HEADER_KV_USAGE = "X-PagedServe-KV-Usage"  # fraction of device KV blocks in use, 0..1
HEADER_NUM_WAITING = "X-PagedServe-Num-Waiting"  # requests waiting to be scheduled
HEADER_NUM_RUNNING = "X-PagedServe-Num-Running"  # requests in the running batch
HEADER_FREE_TOKENS = "X-PagedServe-Free-Tokens"  # KV token slots free right now
HEADER_PREEMPTIONS = "X-PagedServe-Num-Preemptions"  # cumulative preemptions since start
HEADER_STEP_MS = "X-PagedServe-Step-Ms"  # recent engine step time, smoothed, milliseconds
HEADER_GENERATED = "X-PagedServe-Generated-Tokens"  # cumulative tokens generated since start
# The most of the KV cache the requests held will need if none stops before max_tokens (a
# share of the cache; above 1 means a preemption ahead unless some stop early).
HEADER_KV_PROJECTED = "X-PagedServe-KV-Projected"
# A request header: a client (the router) that asks for SSE keep-alive comments on a silent
# stream. Without it a stream carries events only, as OpenAI's do: some clients (vLLM's
# `bench serve` among them) do not skip comments.
HEADER_KEEPALIVE = "X-PagedServe-Keepalive"


@dataclass(slots=True, frozen=True)
class LoadHints:
    kv_cache_usage: float
    num_waiting: int
    num_running: int
    free_token_capacity: int
    num_preemptions: int
    step_ms: float | None = None
    generated_tokens: int | None = None
    kv_projected_usage: float | None = None

    def to_headers(self) -> dict[str, str]:
        headers = {
            HEADER_KV_USAGE: f"{self.kv_cache_usage:.4f}",
            HEADER_NUM_WAITING: str(self.num_waiting),
            HEADER_NUM_RUNNING: str(self.num_running),
            HEADER_FREE_TOKENS: str(self.free_token_capacity),
            HEADER_PREEMPTIONS: str(self.num_preemptions),
        }
        if self.step_ms is not None:
            headers[HEADER_STEP_MS] = f"{self.step_ms:.3f}"
        if self.generated_tokens is not None:
            headers[HEADER_GENERATED] = str(self.generated_tokens)
        if self.kv_projected_usage is not None:
            headers[HEADER_KV_PROJECTED] = f"{self.kv_projected_usage:.4f}"
        return headers

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> LoadHints | None:
        """The hints in a ``GET /load`` body, or None when it is not one."""
        if not isinstance(data, dict):
            return None
        try:
            step_ms, generated = data.get("step_ms"), data.get("generated_tokens")
            projected = data.get("kv_projected_usage")
            return cls(
                kv_cache_usage=float(data["kv_cache_usage"]),
                num_waiting=int(data["num_waiting"]),
                num_running=int(data["num_running"]),
                free_token_capacity=int(data["free_token_capacity"]),
                num_preemptions=int(data["num_preemptions"]),
                step_ms=None if step_ms is None else float(step_ms),
                generated_tokens=None if generated is None else int(generated),
                kv_projected_usage=None if projected is None else float(projected),
            )
        except (KeyError, TypeError, ValueError):
            return None

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
                step_ms=_optional_float(headers.get(HEADER_STEP_MS)),
                generated_tokens=_optional_int(headers.get(HEADER_GENERATED)),
                kv_projected_usage=_optional_float(headers.get(HEADER_KV_PROJECTED)),
            )
        except (KeyError, ValueError):
            return None


def _optional_float(value: str | None) -> float | None:
    return None if value is None else float(value)


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)
