"""``/metrics``: Prometheus text that parses, names under ``pagedserve:``, counters that move
by exactly what a request did."""

from __future__ import annotations

import aiohttp
from openai import AsyncOpenAI
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.server.api import create_app
from pagedserve.server.api.state import METRICS_KEY
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

GAUGES = {
    "pagedserve:num_requests_running",
    "pagedserve:num_requests_waiting",
    "pagedserve:num_requests_swapped",
    "pagedserve:gpu_cache_usage_perc",
    "pagedserve:cpu_cache_usage_perc",
}
COUNTERS = {
    "pagedserve:prefix_cache_queries",
    "pagedserve:prefix_cache_hits",
    "pagedserve:num_preemptions",
    "pagedserve:prompt_tokens",
    "pagedserve:generation_tokens",
    "pagedserve:request_success",
}
HISTOGRAMS = {
    "pagedserve:time_to_first_token_seconds",
    "pagedserve:inter_token_latency_seconds",
    "pagedserve:e2e_request_latency_seconds",
    "pagedserve:request_queue_time_seconds",
    "pagedserve:request_prefill_time_seconds",
    "pagedserve:request_decode_time_seconds",
}


async def scrape(server: LiveServer) -> dict[tuple[str, tuple], float]:
    """Every sample as ``(name, sorted labels) -> value``, plus each family's type."""
    async with aiohttp.ClientSession() as session, session.get(
        server.base_url + "/metrics"
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        samples[("type", family.name)] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted({"model_name": MODEL, **labels}.items()))), 0.0)


async def test_every_metric_is_exposed_with_its_type(server: LiveServer) -> None:
    samples = await scrape(server)
    for name in GAUGES:
        assert samples[("type", name)] == "gauge"
    for name in COUNTERS:
        assert samples[("type", name)] == "counter"
    for name in HISTOGRAMS:
        assert samples[("type", name)] == "histogram"


async def test_counters_move_with_a_request(server: LiveServer, client: AsyncOpenAI) -> None:
    server.wait_until(lambda s: s.num_running == 0)
    before = await scrape(server)
    result = await client.completions.create(model=MODEL, prompt="count these tokens",
                                             max_tokens=5, temperature=0,
                                             extra_body={"ignore_eos": True})
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("pagedserve:prompt_tokens_total") == result.usage.prompt_tokens
    assert delta("pagedserve:generation_tokens_total") == 5
    assert delta("pagedserve:request_success_total", finished_reason="length") == 1
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds"):
        assert delta(f"pagedserve:{name}_count") == 1
    # Five tokens, four gaps between them (two gaps may reach the server as one).
    assert 1 <= delta("pagedserve:inter_token_latency_seconds_count") <= 4
    e2e = delta("pagedserve:e2e_request_latency_seconds_sum")
    assert 0 < delta("pagedserve:request_decode_time_seconds_sum") <= e2e
    assert value(after, "pagedserve:num_requests_running") == 0
    assert value(after, "pagedserve:gpu_cache_usage_perc") == 0


def test_each_app_has_its_own_registry(server: LiveServer) -> None:
    # With the global registry the second app would fail with "Duplicated timeseries".
    first, second = create_app(server.config), create_app(server.config)
    assert first[METRICS_KEY].registry is not second[METRICS_KEY].registry
    assert first[METRICS_KEY].registry is not REGISTRY
