"""Prometheus metrics under vLLM v1's names, types, labels and buckets, so that dashboards
and alerts written for vLLM work unchanged; ``pagedserve:`` names for what vLLM has none.

Engine state (queue lengths, KV usage, cumulative token counts) is read from
``engine.stats()`` when Prometheus scrapes, so nothing is updated per step except the
per-step token histogram. Per-request latencies come from the engine's own timestamps
(``RequestOutput.metrics``), observed as the server sees each output. One
``CollectorRegistry`` per application: two apps in one process (tests, replicas) never
share series.

Once the engine has died, the scheduler gauges (running, waiting, KV usage) are no longer
exported: their last values would describe an engine that no longer exists.
``pagedserve:engine_healthy`` says so (0), and the cumulative counters stay, since what
they counted did happen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedserve.common.http.connection_guard import OPEN_PATHS
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.worker.step_timing import STEP_PHASES

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import AsyncEngine
    from pagedserve.server.engine.engine_stats import StepStats

VLLM = "vllm:"
OWN = "pagedserve:"
# vLLM labels every engine series with its engine core's index; a server here has one.
ENGINE_INDEX = "0"
LABELS = ("model_name", "engine")
# vLLM creates these label values up front, so a rate() over them exists from the start.
FINISH_REASONS = ("stop", "length", "abort", "error")
# The error codes of the refusals the server itself makes (others appear when they occur).
REJECTION_REASONS = ("queue_full", "server_draining", "engine_dead")
STEP_PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                      0.25, 0.5, 1.0, 2.5)

# vLLM v1's bucket choices (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``: vLLM's token-count buckets."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


# (name, help, EngineStats attribute): exported only while the engine is alive.
_GAUGES = (
    (VLLM + "num_requests_running", "Number of requests in model execution batches.",
     "num_running"),
    (VLLM + "num_requests_waiting", "Number of requests waiting to be processed.",
     "num_waiting"),
    (VLLM + "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
     "kv_cache_usage"),
    (OWN + "num_requests_swapped", "Requests whose KV blocks are swapped out to CPU.",
     "num_swapped"),
    (OWN + "cpu_cache_usage_perc", "CPU swap-space usage. 1 means 100 percent usage.",
     "cpu_kv_cache_usage"),
    (OWN + "free_token_capacity", "Token slots in free KV-cache blocks (load hint).",
     "free_token_capacity"),
    (OWN + "kv_cache_total_tokens", "Token slots in the whole device KV cache.",
     "total_kv_tokens"),
)
_COUNTERS = (
    (VLLM + "generation_tokens", "Number of generation tokens processed.",
     "generation_tokens_total"),
    (VLLM + "num_preemptions", "Cumulative number of preemption from the engine.",
     "num_preemptions"),
    (VLLM + "prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
    (VLLM + "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
)


class EngineStatsCollector(Collector):
    """The health gauge, and gauges and counters from one ``engine.stats()`` per scrape."""

    def __init__(self, model_name: str, engine: Callable[[], AsyncEngine | None]) -> None:
        self._values = [model_name, ENGINE_INDEX]
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        healthy = engine is not None and engine.is_healthy
        yield self._family(GaugeMetricFamily, OWN + "engine_healthy",
                           "1 while the engine's step loop runs, 0 once it has stopped.",
                           1.0 if healthy else 0.0)
        if engine is None:
            return  # not started: no numbers rather than made-up zeros
        stats = engine.stats()
        if healthy:
            for name, doc, attr in _GAUGES:
                yield self._family(GaugeMetricFamily, name, doc, getattr(stats, attr))
        for name, doc, attr in _COUNTERS:
            yield self._family(CounterMetricFamily, name, doc, getattr(stats, attr))

    def _family(self, kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str,
                doc: str, value: float) -> Metric:
        family = kind(name, doc, labels=LABELS)
        family.add_metric(self._values, value)
        return family


class ServerMetrics:
    """The application's registry and the observations the handlers and the engine make."""

    def __init__(self, model_name: str, engine: Callable[[], AsyncEngine | None]) -> None:
        self.registry = CollectorRegistry()
        self._values = (model_name, ENGINE_INDEX)
        self.registry.register(EngineStatsCollector(model_name, engine))
        self._prompt_tokens = self._counter(VLLM + "prompt_tokens",
                                            "Number of prefill tokens processed.")
        success = Counter(VLLM + "request_success", "Count of successfully processed requests.",
                          [*LABELS, "finished_reason"], registry=self.registry)
        self._success = {r: success.labels(*self._values, r) for r in FINISH_REASONS}
        self._success_family = success
        self._ttft = self._histogram(VLLM + "time_to_first_token_seconds",
                                     "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self._itl = self._histogram(VLLM + "inter_token_latency_seconds",
                                    "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self._e2e = self._histogram(VLLM + "e2e_request_latency_seconds",
                                    "Histogram of e2e request latency in seconds.")
        self._queue = self._histogram(VLLM + "request_queue_time_seconds",
                                      "Histogram of time spent in WAITING phase for request.")
        self._prefill = self._histogram(VLLM + "request_prefill_time_seconds",
                                        "Histogram of time spent in PREFILL phase for request.")
        self._decode = self._histogram(VLLM + "request_decode_time_seconds",
                                       "Histogram of time spent in DECODE phase for request.")
        self._inference = self._histogram(
            VLLM + "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.")
        self._params_n = self._histogram(VLLM + "request_params_n",
                                         "Histogram of the n request parameter.", N_BUCKETS)
        self._iteration_tokens = self._histogram(
            VLLM + "iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS)
        # Token-count buckets follow max_model_len, known once the engine has loaded.
        self._request_prompt_tokens: Histogram | None = None
        self._request_generation_tokens: Histogram | None = None
        self._params_max_tokens: Histogram | None = None
        self._http = Counter(OWN + "http_responses", "HTTP responses by route and status.",
                             ["route", "method", "status"], registry=self.registry)
        self._rejections = Counter(
            OWN + "admission_rejections",
            "Requests refused before any work (HTTP 429 and 503), by error code.",
            [*LABELS, "reason"], registry=self.registry)
        for reason in REJECTION_REASONS:
            self._rejections.labels(*self._values, reason)
        # pagedserve's own: where each engine step's wall time goes (step_timing.py).
        self._step_phase = Histogram(
            OWN + "step_phase_seconds",
            "Wall time of one engine step's phase: schedule, prepare, forward, sample, output.",
            [*LABELS, "phase"], registry=self.registry, buckets=STEP_PHASE_BUCKETS)
        for phase in STEP_PHASES:
            self._step_phase.labels(*self._values, phase)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, LABELS, registry=self.registry).labels(*self._values)

    def _histogram(self, name: str, doc: str,
                   buckets: tuple[float, ...] = REQUEST_LATENCY_BUCKETS) -> Histogram:
        histogram = Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets)
        return histogram.labels(*self._values)

    def attach(self, engine: AsyncEngine) -> None:
        """Called once the engine runs: the per-step histogram and the token-count ones."""
        buckets = buckets_1_2_5(engine.max_model_len)
        self._request_prompt_tokens = self._histogram(
            VLLM + "request_prompt_tokens", "Number of prefill tokens processed.", buckets)
        self._request_generation_tokens = self._histogram(
            VLLM + "request_generation_tokens", "Number of generation tokens processed.",
            buckets)
        self._params_max_tokens = self._histogram(
            VLLM + "request_params_max_tokens",
            "Histogram of the max_tokens request parameter.", buckets)
        self._cache_config_info(engine)
        self._parallel_config(engine)
        engine.add_step_observer(self._observe_step)

    def _cache_config_info(self, engine: AsyncEngine) -> None:
        """vLLM's info-style gauge (always 1): the KV cache's configuration in its labels."""
        args, kv = engine.engine_args, engine.engine.kv_cache
        info = {
            "block_size": args.block_size,
            "num_gpu_blocks": kv.num_device_blocks,
            "num_cpu_blocks": kv.num_cpu_blocks,
            "enable_prefix_caching": args.enable_prefix_caching,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "swap_space": engine.engine.cache_config.swap_space,
            "engine": ENGINE_INDEX,
        }
        gauge = Gauge(VLLM + "cache_config_info", "Information of the LLMEngine CacheConfig",
                      list(info), registry=self.registry)
        gauge.labels(**{k: str(v) for k, v in info.items()}).set(1)

    def _parallel_config(self, engine: AsyncEngine) -> None:
        """Tensor parallelism: the number of ranks and each rank's share of the KV cache."""
        info = engine.engine.parallel_info()
        for name, doc, value in (
            ("tensor_parallel_size", "Ranks the model is split across (tensor parallelism).",
             info.tensor_parallel_size),
            ("kv_cache_blocks_per_rank", "KV-cache blocks of each rank's device pool (the same "
             "on every rank: the block tables are shared).", info.kv_blocks_per_rank),
            ("kv_cache_bytes_per_rank", "Device memory of each rank's share of the KV cache.",
             info.kv_bytes_per_rank),
        ):
            gauge = Gauge(OWN + name, doc, LABELS, registry=self.registry)
            gauge.labels(*self._values).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- engine and requests --------------------------------------------------------------

    def _observe_step(self, step: StepStats) -> None:
        # Runs in the engine's thread; prometheus_client's metrics are thread-safe.
        self._iteration_tokens.observe(step.num_prefill_tokens + step.num_decode_tokens)
        for phase, seconds in step.phase_seconds.items():
            self._step_phase.labels(*self._values, phase).observe(seconds)

    def observe_first_token(self, output: RequestOutput) -> None:
        """The request's prompt is now fully computed and its first token exists."""
        self._prompt_tokens.inc(len(output.prompt_token_ids))
        m = output.metrics
        if m.first_token_time is not None:
            self._ttft.observe(max(0.0, m.first_token_time - m.arrival_time))

    def observe_inter_token_latency(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def count_aborted(self) -> None:
        self._success["abort"].inc()

    def observe_finished(self, output: RequestOutput, params: SamplingParams) -> None:
        reasons = [o.finish_reason for o in output.outputs if o.finish_reason]
        reason = reasons[0] if reasons else "abort"
        counter = self._success.get(reason)
        if counter is None:
            counter = self._success_family.labels(*self._values, reason)
        counter.inc()
        m = output.metrics
        spans = (
            (self._e2e, m.arrival_time, m.finished_time),
            (self._queue, m.arrival_time, m.first_scheduled_time),
            (self._prefill, m.first_scheduled_time, m.first_token_time),
            (self._decode, m.first_token_time, m.last_token_time),
            (self._inference, m.first_scheduled_time, m.finished_time),
        )
        for histogram, start, end in spans:
            if start is not None and end is not None:
                histogram.observe(max(0.0, end - start))
        self._params_n.observe(params.n)
        if self._request_prompt_tokens is not None:
            self._request_prompt_tokens.observe(len(output.prompt_token_ids))
        if self._request_generation_tokens is not None:
            self._request_generation_tokens.observe(
                sum(len(o.token_ids) for o in output.outputs))
        if self._params_max_tokens is not None and params.max_tokens is not None:
            self._params_max_tokens.observe(params.max_tokens)

    # -- HTTP -----------------------------------------------------------------------------

    def count_response(self, request: web.Request, response: web.StreamResponse) -> None:
        resource = request.match_info.route.resource
        # The route's pattern, not the path: /v1/models/{model} is one series, and unknown
        # paths cannot grow the label set.
        route = resource.canonical if resource is not None else "unmatched"
        self._http.labels(route, request.method, str(response.status)).inc()
        # /health's 503 reports the server's state; it refuses nobody's work.
        if response.status in (429, 503) and request.path not in OPEN_PATHS:
            self._rejections.labels(*self._values, _error_code(response)).inc()


def _error_code(response: web.StreamResponse) -> str:
    """The OpenAI error body's ``code`` (the middleware writes every error as JSON)."""
    body = response.body if isinstance(response, web.Response) else None
    try:
        code = orjson.loads(body)["error"]["code"] if isinstance(body, bytes) else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = None
    return str(code) if code is not None else f"http_{response.status}"


METRICS_KEY = web.AppKey("metrics", ServerMetrics)
