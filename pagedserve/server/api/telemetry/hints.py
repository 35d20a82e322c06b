"""Load hints: headers on every response and ``GET /load``, from one ``engine.stats()``.

The step time comes from a ``StepClock`` that watches the engine's steps: clients read it as
the delay signal of their in-flight budget (a step's time is each running sequence's time per
output token), so it is smoothed over the last few steps but never over idle time. A
``ThroughputCurve`` watches the same steps, and ``GET /load`` names the running count at which
they made the most tokens per second (``best_running``), where a client's search can start.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from aiohttp import web

from pagedserve.common.load_hints import LoadHints
from pagedserve.server.api.config.app_keys import ENGINE_KEY
from pagedserve.server.api.http.jsonio import json_response
from pagedserve.server.api.telemetry.throughput_curve import ThroughputCurve
from pagedserve.server.api.web.paths import is_page_path

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import AsyncEngine
    from pagedserve.server.engine.engine_stats import EngineStats, StepStats

# Weight of the newest step: about the last five steps count, so a change in the batch shows
# within a few hundred milliseconds on CPU while one slow step does not swing the signal.
STEP_SMOOTHING = 0.3


_UNAUTHENTICATED = frozenset({401, 403})


class StepClock:
    """Smoothed duration of the engine's recent steps (an observer of the engine loop)."""

    def __init__(self, smoothing: float = STEP_SMOOTHING) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self._step_s: float | None = None
        self._lock = threading.Lock()  # written by the engine thread, read by handlers

    def __call__(self, step: StepStats) -> None:
        if step.num_prefill_tokens == 0 and step.num_decode_tokens == 0:
            return  # an empty step says nothing about the cost of work
        with self._lock:
            previous = self._step_s
            self._step_s = step.duration_s if previous is None else (
                previous + self.smoothing * (step.duration_s - previous))

    @property
    def step_ms(self) -> float | None:
        with self._lock:
            return None if self._step_s is None else self._step_s * 1000.0


STEP_CLOCK_KEY = web.AppKey("step_clock", StepClock)
THROUGHPUT_CURVE_KEY = web.AppKey("throughput_curve", ThroughputCurve)


def track_steps(app: web.Application, engine: AsyncEngine) -> None:
    """Start timing ``engine``'s steps for the hints; call once the engine is up."""
    clock = StepClock()
    engine.add_step_observer(clock)
    app[STEP_CLOCK_KEY] = clock
    curve = ThroughputCurve()
    engine.add_step_observer(curve)
    app[THROUGHPUT_CURVE_KEY] = curve


def _hints(stats: EngineStats, clock: StepClock | None) -> LoadHints:
    return LoadHints(
        kv_cache_usage=stats.kv_cache_usage,
        num_waiting=stats.num_waiting,
        num_running=stats.num_running,
        free_token_capacity=stats.free_token_capacity,
        num_preemptions=stats.num_preemptions,
        step_ms=clock.step_ms if clock is not None else None,
        generated_tokens=stats.generation_tokens_total,
        kv_projected_usage=stats.kv_projected_usage,
    )


async def add_load_hints(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the engine's load as of this response; none for a client
    that has not authenticated."""
    engine = request.app.get(ENGINE_KEY)
    # The page's files are served without a key, so they carry no hints either.
    if engine is not None and response.status not in _UNAUTHENTICATED and not is_page_path(
            request.path):
        hints = _hints(engine.stats(), request.app.get(STEP_CLOCK_KEY))
        response.headers.update(hints.to_headers())


async def get_load(request: web.Request) -> web.Response:
    stats = request.app[ENGINE_KEY].stats()
    curve = request.app.get(THROUGHPUT_CURVE_KEY)
    best = curve.best() if curve is not None else None
    body = {
        **_hints(stats, request.app.get(STEP_CLOCK_KEY)).to_json(),
        "max_num_seqs": stats.max_num_seqs,
        "max_num_batched_tokens": stats.max_num_batched_tokens,
        "total_kv_tokens": stats.total_kv_tokens,
        "best_running": None if best is None else best.running,
        "best_tokens_per_s": None if best is None else round(best.tokens_per_s, 1),
    }
    return json_response(body)
