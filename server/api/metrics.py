"""Prometheus metrics under ``pagedserve:``, with vLLM's names and meanings.

Engine state (queue lengths, KV usage, cumulative token counts) is read from
``engine.stats()`` when Prometheus scrapes, so nothing is updated per step. Per-request
latencies come from the engine's own timestamps (``RequestOutput.metrics``), observed as
the server sees each output. One ``CollectorRegistry`` per application: two apps in one
process (tests, replicas) never share series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedserve.server.engine.outputs import RequestOutput

if TYPE_CHECKING:
    from pagedserve.server.distributed.info import ParallelInfo
    from pagedserve.server.engine.async_engine import EngineStats

PREFIX = "pagedserve:"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                      0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)

# (name, help, EngineStats attribute)
_GAUGES = (
    ("num_requests_running", "Requests in the running batch.", "num_running"),
    ("num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting"),
    ("num_requests_swapped", "Requests whose KV blocks are swapped out to CPU.",
     "num_swapped"),
    ("gpu_cache_usage_perc", "Fraction of device KV-cache blocks in use (1 = 100%).",
     "kv_cache_usage"),
    ("cpu_cache_usage_perc", "Fraction of CPU swap-space blocks in use (1 = 100%).",
     "cpu_kv_cache_usage"),
)
_COUNTERS = (
    ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
     "prefix_cache_queries"),
    ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
    ("num_preemptions", "Requests preempted (recomputed or swapped out).", "num_preemptions"),
    ("prompt_tokens", "Prompt tokens computed (prefill).", "prompt_tokens_total"),
    ("generation_tokens", "Tokens generated (decode).", "generation_tokens_total"),
)


class EngineStatsCollector(Collector):
    """Gauges and counters from one ``engine.stats()`` snapshot per scrape."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self._model_name = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return  # the engine has not started: no numbers rather than made-up zeros
        for name, doc, attr in _GAUGES:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model_name], getattr(stats, attr))
            yield family
        for name, doc, attr in _COUNTERS:
            family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model_name], getattr(stats, attr))
            yield family


class ServerMetrics:
    """The application's registry and the per-request observations the handlers make."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        self.registry.register(EngineStatsCollector(model_name, stats))
        self._success = Counter(
            PREFIX + "request_success", "Requests finished, by finish reason.",
            ["model_name", "finished_reason"], registry=self.registry,
        )
        self._ttft = self._histogram("time_to_first_token_seconds",
                                     "Arrival to first generated token.")
        self._itl = self._histogram("inter_token_latency_seconds",
                                    "Time between successive tokens of a request "
                                    "(vLLM's time_per_output_token).", _TOKEN_GAP_BUCKETS)
        self._e2e = self._histogram("e2e_request_latency_seconds", "Arrival to finish.")
        self._queue = self._histogram("request_queue_time_seconds",
                                      "Arrival to first scheduled.")
        self._prefill = self._histogram("request_prefill_time_seconds",
                                        "First scheduled to first token.")
        self._decode = self._histogram("request_decode_time_seconds",
                                       "First token to last token.")

    def _histogram(self, name: str, doc: str,
                   buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
        histogram = Histogram(PREFIX + name, doc, ["model_name"], registry=self.registry,
                              buckets=buckets)
        return histogram.labels(self._model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_inter_token_latency(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def count_aborted(self) -> None:
        self._success.labels(self._model_name, "abort").inc()

    def observe_finished(self, output: RequestOutput) -> None:
        reasons = [o.finish_reason for o in output.outputs if o.finish_reason]
        self._success.labels(self._model_name, reasons[0] if reasons else "abort").inc()
        m = output.metrics
        spans = (
            (self._ttft, m.arrival_time, m.first_token_time),
            (self._e2e, m.arrival_time, m.finished_time),
            (self._queue, m.arrival_time, m.first_scheduled_time),
            (self._prefill, m.first_scheduled_time, m.first_token_time),
            (self._decode, m.first_token_time, m.last_token_time),
        )
        for histogram, start, end in spans:
            if start is not None and end is not None:
                histogram.observe(max(0.0, end - start))


# (name, help, ParallelInfo attribute): fixed at start-up, read at each scrape.
_PARALLEL_GAUGES = (
    ("tensor_parallel_size", "Ranks the model is split across (tensor parallelism).",
     "tensor_parallel_size"),
    ("kv_cache_blocks_per_rank", "KV-cache blocks of each rank's device pool (the same on "
     "every rank).", "kv_blocks_per_rank"),
    ("kv_cache_bytes_per_rank", "Device memory of each rank's share of the KV cache.",
     "kv_bytes_per_rank"),
)


class ParallelConfigCollector(Collector):
    """The tensor-parallel size and each rank's KV capacity, as gauges."""

    def __init__(self, model_name: str, info: Callable[[], ParallelInfo | None]) -> None:
        self._model_name = model_name
        self._info = info

    def collect(self) -> Iterator[Metric]:
        info = self._info()
        if info is None:
            return
        for name, doc, attr in _PARALLEL_GAUGES:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model_name], getattr(info, attr))
            yield family
