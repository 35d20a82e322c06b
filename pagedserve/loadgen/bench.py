"""One benchmark from settings to result dict: session, dataset, timed run, metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from pagedserve.loadgen.bench_config import LoadShape, MetricSpec, RequestSpec
from pagedserve.loadgen.datasets import DatasetSpec, SampleRequest, load_dataset
from pagedserve.loadgen.hf_tokenizer import HFTokenizerCounter, is_tokenizer_dir
from pagedserve.loadgen.metrics import BenchmarkMetrics, calculate_metrics
from pagedserve.loadgen.report import (
    detailed_fields,
    failure_fields,
    metrics_fields,
    timestamp,
)
from pagedserve.loadgen.request import RequestResult
from pagedserve.loadgen.runner import BenchmarkRunner, RunOutcome
from pagedserve.loadgen.tokenizers import (
    SERVER_TOKENIZER,
    ServerTokenCounter,
    TiktokenCounter,
    TokenCounter,
)


@dataclass(slots=True)
class BenchSettings:
    request: RequestSpec
    shape: LoadShape
    dataset: DatasetSpec
    metrics: MetricSpec = field(default_factory=MetricSpec)
    # a tiktoken encoding, a local Hugging Face tokenizer directory, or "server" (/tokenize)
    tokenizer: str = "cl100k_base"
    backend: str = "openai"  # vLLM's name for the client flavour; recorded in the result
    show_progress: bool = True
    save_detailed: bool = False
    label: str | None = None
    api_key: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.dataset.seed

    def with_shape(self, **changes: object) -> BenchSettings:
        """A copy under another load shape (validated again), as a sweep point uses."""
        return replace(self, shape=replace(self.shape, **changes))


@dataclass(slots=True)
class BenchOutput:
    result: dict[str, Any]  # the fields --result-json writes
    outcome: RunOutcome
    metrics: BenchmarkMetrics


def make_session(max_connections: int | None) -> aiohttp.ClientSession:
    """A session pooling at most ``max_connections`` connections (None: unlimited)."""
    connector = aiohttp.TCPConnector(limit=max_connections or 0, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def make_counter(settings: BenchSettings, session: aiohttp.ClientSession) -> TokenCounter:
    if settings.tokenizer == SERVER_TOKENIZER:
        headers = dict(settings.request.headers)
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        return ServerTokenCounter(session, settings.request.base_url, settings.request.model,
                                  headers=headers)
    if is_tokenizer_dir(settings.tokenizer):
        return HFTokenizerCounter(settings.tokenizer)
    return TiktokenCounter(settings.tokenizer)


async def prepare_samples(settings: BenchSettings, counter: TokenCounter) -> list[SampleRequest]:
    return await load_dataset(settings.dataset, settings.shape.num_prompts, counter,
                              chat=settings.request.endpoint == "chat")


async def fill_output_tokens(results: list[RequestResult], counter: TokenCounter) -> None:
    """Counts generated text for successful requests whose server sent no usage."""
    missing = [r for r in results if r.success and r.output_tokens is None]
    if not missing:
        return
    for result, count in zip(missing, await counter.count([r.text for r in missing]),
                             strict=True):
        result.output_tokens = count
        result.output_tokens_source = "tokenizer"


async def run_once(session: aiohttp.ClientSession, counter: TokenCounter,
                   samples: list[SampleRequest], settings: BenchSettings) -> BenchOutput:
    runner = BenchmarkRunner(session, settings.request, settings.shape, samples,
                             seed=settings.seed, show_progress=settings.show_progress,
                             api_key=settings.api_key)
    outcome = await runner.run()
    await fill_output_tokens(outcome.results, counter)
    spec = settings.metrics
    metrics = calculate_metrics(outcome, settings.request.n, spec.metric_percentiles,
                                spec.goodput)
    result = header_fields(settings, len(samples))
    result.update(metrics_fields(metrics, spec.percentile_metrics, spec.metric_percentiles))
    result.update(output_source_fields(outcome.results))
    result.update(failure_fields(outcome.results))
    if settings.save_detailed:
        result.update(detailed_fields(outcome.results, settings.request.n))
    return BenchOutput(result, outcome, metrics)


async def bench(settings: BenchSettings) -> BenchOutput:
    async with make_session(settings.shape.max_concurrency) as session:
        counter = make_counter(settings, session)
        samples = await prepare_samples(settings, counter)
        return await run_once(session, counter, samples, settings)


def header_fields(settings: BenchSettings, num_distinct_prompts: int) -> dict:
    """What was run, under vLLM's names where they exist."""
    request, shape = settings.request, settings.shape
    fields = {
        "date": timestamp(),
        "label": settings.label,
        "backend": settings.backend,
        "endpoint_type": request.endpoint,
        "endpoint": request.route,
        "base_url": request.base_url,
        "model_id": request.model,
        "tokenizer_id": settings.tokenizer,
        "dataset_name": settings.dataset.name,
        "num_prompts": shape.num_prompts,
        "num_distinct_prompts": num_distinct_prompts,
        "request_rate": shape.request_rate if math.isfinite(shape.request_rate) else "inf",
        "burstiness": shape.burstiness,
        "arrival": shape.arrival,
        "max_concurrency": shape.max_concurrency,
        "duration_limit": shape.duration,
        "ramp_up_strategy": shape.ramp_up_strategy,
        "ramp_up_start_rps": shape.ramp_up_start_rps,
        "ramp_up_end_rps": shape.ramp_up_end_rps,
        "num_warmups": shape.num_warmups,
        "n": request.n,
        "best_of": request.best_of,
        "use_beam_search": request.use_beam_search,
        "temperature": request.effective_temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "logprobs": request.logprobs,
        "streamed": request.streams,
        "ignore_eos": request.ignore_eos,
        "seed": settings.seed,
        "percentile_metrics": list(settings.metrics.percentile_metrics),
        "metric_percentiles": list(settings.metrics.metric_percentiles),
        "goodput_slos_ms": dict(settings.metrics.goodput) or None,
    }
    fields.update(settings.metadata)
    return fields


def output_source_fields(results: list[RequestResult]) -> dict:
    ok = [r for r in results if r.success]
    return {
        "output_tokens_from_usage": sum(r.output_tokens_source == "usage" for r in ok),
        "output_tokens_from_tokenizer": sum(r.output_tokens_source == "tokenizer" for r in ok),
    }
