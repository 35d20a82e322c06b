"""Validated settings of a benchmark run, grouped by what they shape.

Each group checks itself on construction, so a bad value fails before any request is sent,
with a :class:`BenchConfigError` that names the option, the value and the allowed range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pagedserve.loadgen.bench_errors import BenchConfigError

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# vLLM's --backend names: each speaks one of the two endpoints.
BACKEND_ENDPOINTS = {"openai": "completions", "vllm": "completions", "openai-chat": "chat"}
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
ARRIVALS = ("gamma", "constant")
RAMP_UP_STRATEGIES = ("linear", "exponential")


def _require(ok: bool, option: str, value: object, limit: str) -> None:
    if not ok:
        raise BenchConfigError(option, value, limit)


def endpoint_kind(path: str) -> str | None:
    """``completions`` or ``chat`` for an endpoint path such as ``/v1/chat/completions``."""
    path = path.rstrip("/")
    if path.endswith("chat/completions"):
        return "chat"
    return "completions" if path.endswith("completions") else None


@dataclass(slots=True)
class RequestSpec:
    """What every request asks of the server.

    ``base_url`` is the server root; a trailing ``/v1`` is dropped when the endpoint path
    starts with ``/v1/`` (``--base-url http://host/v1`` as the OpenAI SDK takes it). ``path``
    overrides the endpoint's standard path (vLLM's ``--endpoint /v1/completions``).
    """

    base_url: str
    model: str
    endpoint: str = "completions"
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    extra_body: dict[str, object] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    request_timeout: float = 6 * 60 * 60.0
    path: str | None = None

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        _require(self.base_url.startswith(("http://", "https://")), "--base-url", self.base_url,
                 "an http:// or https:// URL")
        _require(bool(self.model), "--model", self.model, "a non-empty model name")
        _require(self.endpoint in ENDPOINT_PATHS, "--endpoint", self.endpoint,
                 f"one of {sorted(ENDPOINT_PATHS)}")
        if self.path is not None:
            _require(self.path.startswith("/") and endpoint_kind(self.path) == self.endpoint,
                     "--endpoint", self.path,
                     f"a path ending in {ENDPOINT_PATHS[self.endpoint].removeprefix('/v1')} "
                     f"for {self.endpoint} requests")
        if self.route.startswith("/v1/"):
            self.base_url = self.base_url.removesuffix("/v1")
        _require(self.n >= 1, "--n", self.n, "at least 1")
        _require(self.best_of is None or self.best_of >= self.n, "--best-of", self.best_of,
                 f"at least --n ({self.n})")
        _require(self.temperature is None or self.temperature >= 0.0, "--temperature",
                 self.temperature, "non-negative")
        _require(not (self.use_beam_search and (self.temperature or 0.0) > 0.0), "--temperature",
                 self.temperature, "0 with --use-beam-search")
        _require(self.request_timeout > 0.0, "--request-timeout", self.request_timeout,
                 "positive")
        _require(self.top_p is None or 0.0 < self.top_p <= 1.0, "--top-p", self.top_p,
                 "in (0, 1]")
        _require(self.top_k is None or self.top_k == -1 or self.top_k >= 1, "--top-k",
                 self.top_k, "-1 (off) or at least 1")
        _require(self.min_p is None or 0.0 <= self.min_p <= 1.0, "--min-p", self.min_p,
                 "in [0, 1]")
        _require(self.logprobs is None or self.logprobs >= 0, "--logprobs", self.logprobs,
                 "non-negative")

    @property
    def route(self) -> str:
        return self.path or ENDPOINT_PATHS[self.endpoint]

    @property
    def url(self) -> str:
        return self.base_url + self.route

    @property
    def streams(self) -> bool:
        """Beam search and best_of > n pick their answer at the end: nothing to stream."""
        return not (self.use_beam_search or (self.best_of is not None and self.best_of > self.n))

    @property
    def effective_temperature(self) -> float:
        """Greedy unless asked; parallel samples default to 1.0 so that they differ."""
        if self.temperature is not None:
            return self.temperature
        return 1.0 if self.n > 1 and not self.use_beam_search else 0.0


@dataclass(slots=True)
class LoadShape:
    """When requests are sent: arrival process, concurrency cap, run length."""

    num_prompts: int = 1000
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrival: str = "gamma"
    max_concurrency: int | None = None
    duration: float | None = None
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    num_warmups: int = 0

    def __post_init__(self) -> None:
        _require(self.num_prompts >= 1, "--num-prompts", self.num_prompts, "at least 1")
        _require(self.request_rate > 0.0, "--request-rate", self.request_rate,
                 "positive (inf sends every request at once)")
        _require(0.0 < self.burstiness < math.inf, "--burstiness", self.burstiness,
                 "positive and finite")
        _require(self.arrival in ARRIVALS, "--arrival", self.arrival, f"one of {ARRIVALS}")
        _require(self.arrival == "gamma" or self.burstiness == 1.0, "--burstiness",
                 self.burstiness, "1.0 with --arrival constant")
        _require(self.max_concurrency is None or self.max_concurrency >= 1, "--max-concurrency",
                 self.max_concurrency, "at least 1")
        _require(self.num_warmups >= 0, "--num-warmups", self.num_warmups, "non-negative")
        self._check_duration()
        self._check_ramp_up()

    def _check_duration(self) -> None:
        if self.duration is None:
            return
        _require(0.0 < self.duration < math.inf, "--duration", self.duration,
                 "positive and finite")
        _require(self.is_open_loop or self.max_concurrency is not None, "--max-concurrency",
                 self.max_concurrency, "set when --duration runs at an infinite --request-rate")

    def _check_ramp_up(self) -> None:
        if self.ramp_up_strategy is None:
            _require(self.ramp_up_start_rps is None and self.ramp_up_end_rps is None,
                     "--ramp-up-strategy", None, "set when ramp-up rates are given")
            return
        _require(self.ramp_up_strategy in RAMP_UP_STRATEGIES, "--ramp-up-strategy",
                 self.ramp_up_strategy, f"one of {RAMP_UP_STRATEGIES}")
        for option, value in (("--ramp-up-start-rps", self.ramp_up_start_rps),
                              ("--ramp-up-end-rps", self.ramp_up_end_rps)):
            _require(value is not None and 0.0 < value < math.inf, option, value,
                     "positive and finite with --ramp-up-strategy")
        _require(self.duration is None, "--duration", self.duration,
                 "unset with --ramp-up-strategy (the ramp spans --num-prompts requests)")
        _require(math.isinf(self.request_rate), "--request-rate", self.request_rate,
                 "unset with --ramp-up-strategy (the ramp sets the rate)")

    @property
    def is_open_loop(self) -> bool:
        """Requests follow a schedule, rather than each waiting for a free slot."""
        return math.isfinite(self.request_rate) or self.ramp_up_strategy is not None


@dataclass(slots=True)
class MetricSpec:
    """Which statistics to report and which SLOs define a good request."""

    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    metric_percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    goodput: dict[str, float] = field(default_factory=dict)  # metric -> SLO in ms

    def __post_init__(self) -> None:
        for name in self.percentile_metrics:
            _require(name in LATENCY_METRICS, "--percentile-metrics", name,
                     f"one of {LATENCY_METRICS}")
        for p in self.metric_percentiles:
            _require(0.0 <= p <= 100.0, "--metric-percentiles", p, "in [0, 100]")
        for name, slo in self.goodput.items():
            _require(name in GOODPUT_METRICS, "--goodput", name, f"one of {GOODPUT_METRICS}")
            _require(0.0 <= slo < math.inf, "--goodput", slo, f"a non-negative {name} in ms")


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` → ``{"ttft": 200.0, "tpot": 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        _require(bool(sep) and bool(value), "--goodput", item, "KEY:MILLISECONDS")
        try:
            slos[name.strip()] = float(value)
        except ValueError:
            raise BenchConfigError("--goodput", item, "KEY:MILLISECONDS") from None
    return slos


def parse_csv_floats(option: str, text: str) -> tuple[float, ...]:
    """``"50,90,99"`` → ``(50.0, 90.0, 99.0)``."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BenchConfigError(option, text, "comma-separated numbers") from None
    _require(bool(values), option, text, "at least one number")
    return values


def parse_csv_names(option: str, text: str) -> tuple[str, ...]:
    """``"ttft, tpot"`` → ``("ttft", "tpot")``."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    _require(bool(names), option, text, "at least one name")
    return names
