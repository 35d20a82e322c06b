"""``/metrics``: Prometheus text under vLLM v1's names, types, labels and buckets (so vLLM
dashboards work unchanged), counters that move by exactly what a request did, pagedserve's
own series, and what a dead engine exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.server.api import create_app
from pagedserve.server.api.telemetry.metrics import METRICS_KEY
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/dashboards/pagedserve.json"

GAUGES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "pagedserve:num_requests_swapped",
    "pagedserve:cpu_cache_usage_perc",
    "pagedserve:free_token_capacity",
    "pagedserve:kv_cache_total_tokens",
    "pagedserve:engine_healthy",
    "vllm:cache_config_info",
    "pagedserve:tensor_parallel_size",
    "pagedserve:kv_cache_blocks_per_rank",
    "pagedserve:kv_cache_bytes_per_rank",
}
COUNTERS = {
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "pagedserve:http_responses",
    "pagedserve:admission_rejections",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:request_inference_time_seconds",
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "pagedserve:step_phase_seconds",
}
# Series without vLLM's engine labels: HTTP traffic is the server's, not one engine's, and
# vLLM's info gauge carries the cache configuration (and the engine) as its labels.
SERVER_WIDE = {"pagedserve:http_responses", "vllm:cache_config_info"}
ENGINE_LABELS = {"model_name": MODEL, "engine": "0"}

# vLLM v1's buckets, as vllm/v1/metrics/loggers.py declares them.
VLLM_BUCKETS = {
    "vllm:time_to_first_token_seconds": [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:iteration_tokens_total": [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    # The live checkpoint's max_model_len is 1024: 1-2-5 steps up to it.
    "vllm:request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
    "vllm:request_params_n": [1, 2, 5, 10, 20],
}

Samples = dict[tuple[str, tuple], float | str]


async def scrape(server: LiveServer) -> Samples:
    """Every sample as ``(name, sorted labels) -> value``, plus each family's type."""
    async with aiohttp.ClientSession() as session, session.get(
        server.base_url + "/metrics"
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        samples[("type", family.name)] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted({**ENGINE_LABELS, **labels}.items()))), 0.0)


def labels_of(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (sample, labels) in samples if sample == name]


async def test_every_metric_has_its_type_and_vllm_labels(server: LiveServer) -> None:
    samples = await scrape(server)
    for names, kind, suffix in ((GAUGES, "gauge", ""), (COUNTERS, "counter", "_total"),
                                (HISTOGRAMS, "histogram", "_count")):
        for name in names:
            assert samples[("type", name)] == kind, name
            if name in SERVER_WIDE or name == "pagedserve:admission_rejections":
                continue  # labelled by route / reason; checked where they move
            series = labels_of(samples, name + suffix)
            assert series, name
            for labels in series:
                assert {k: labels[k] for k in ENGINE_LABELS} == ENGINE_LABELS, name
    (info,) = labels_of(samples, "vllm:cache_config_info")
    assert info == {"block_size": "16", "num_gpu_blocks": "64",
                    "num_cpu_blocks": str(server.engine.engine.kv_cache.num_cpu_blocks),
                    "enable_prefix_caching": "False", "gpu_memory_utilization": "0.9",
                    "swap_space": "0.0", "engine": "0"}
    # vLLM creates every finish reason's series up front.
    reasons = {s["finished_reason"] for s in labels_of(samples, "vllm:request_success_total")}
    assert {"stop", "length", "abort"} <= reasons


async def test_histograms_use_vllm_buckets(server: LiveServer) -> None:
    samples = await scrape(server)
    for name, buckets in VLLM_BUCKETS.items():
        bounds = sorted(float(labels["le"]) for labels in labels_of(samples, name + "_bucket"))
        assert bounds == [float(b) for b in buckets] + [float("inf")], name


async def test_counters_move_with_a_request(server: LiveServer, client: AsyncOpenAI) -> None:
    server.wait_until(lambda s: s.num_running == 0)
    before = await scrape(server)
    result = await client.completions.create(model=MODEL, prompt="count these tokens",
                                             max_tokens=5, temperature=0,
                                             extra_body={"ignore_eos": True})
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    prompt = result.usage.prompt_tokens
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == 5
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds",
                 "request_prompt_tokens", "request_generation_tokens", "request_params_n",
                 "request_params_max_tokens"):
        assert delta(f"vllm:{name}_count") == 1, name
    assert delta("vllm:request_prompt_tokens_sum") == prompt
    assert delta("vllm:request_generation_tokens_sum") == 5
    assert (delta("vllm:request_params_n_sum"), delta("vllm:request_params_max_tokens_sum")) == (
        1, 5)
    # Every token the engine computed, over however many steps it took.
    assert delta("vllm:iteration_tokens_total_sum") == prompt + 5
    # Five tokens, four gaps between them (two gaps may reach the server as one).
    assert 1 <= delta("vllm:inter_token_latency_seconds_count") <= 4
    e2e = delta("vllm:e2e_request_latency_seconds_sum")
    assert 0 < delta("vllm:request_decode_time_seconds_sum") <= e2e
    assert 0 < delta("vllm:request_inference_time_seconds_sum") <= e2e
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0
    assert value(after, "pagedserve:engine_healthy") == 1


async def test_http_responses_by_route_and_status(server: LiveServer) -> None:
    def count(samples: Samples, route: str, method: str, status: str) -> float:
        labels = {"route": route, "method": method, "status": status}
        return samples.get(("pagedserve:http_responses_total",
                            tuple(sorted(labels.items()))), 0.0)

    calls = [("/v1/models", "200"), ("/v1/models/tiny-test", "200"), ("/v1/models/nope", "404"),
             ("/no/such/path", "404")]
    before = await scrape(server)
    async with aiohttp.ClientSession() as session:
        for path, status in calls:
            async with session.get(server.base_url + path) as response:
                assert str(response.status) == status
    after = await scrape(server)
    expected = {("/v1/models", "200"): 1, ("/v1/models/{model}", "200"): 1,
                ("/v1/models/{model}", "404"): 1, ("unmatched", "404"): 1}
    for (route, status), n in expected.items():
        assert count(after, route, "GET", status) - count(before, route, "GET", status) == n


async def test_every_name_the_dashboard_queries_is_exported(server: LiveServer) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"(?:vllm|pagedserve):[a-z0-9_]+", target["expr"])
            if not name.startswith("pagedserve:router_")}  # the router's: test_deploy_files
    samples = await scrape(server)
    exported = {name for name, _labels in samples if name != "type"}
    assert used, "the dashboard queries nothing"
    assert used <= exported, sorted(used - exported)
    # Every family this server exports is on a panel.
    families = {name for kind, name in samples
                if kind == "type" and not name.endswith("_created")}
    on_panels = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert families - on_panels == set(), sorted(families - on_panels)


@pytest.fixture
def dead_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir))).start()
    yield live
    live.stop()


async def test_a_dead_engine_stops_the_scheduler_gauges(dead_server: LiveServer) -> None:
    server = dead_server
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(server.base_url + "/v1/completions", json=body) as response:
            assert response.status == 200
        alive = await scrape(server)
        server.call(server.engine.shutdown)
        async with session.post(server.base_url + "/v1/completions", json=body) as response:
            assert response.status == 503
        async with session.get(server.base_url + "/health") as response:
            assert response.status == 503
    dead = await scrape(server)
    assert (value(alive, "pagedserve:engine_healthy"), value(dead, "pagedserve:engine_healthy")
            ) == (1, 0)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "pagedserve:free_token_capacity"):
        assert ("type", name) in alive
        assert ("type", name) not in dead, f"{name} still exported after the engine died"
    # What was counted did happen: the counters stay.
    assert value(dead, "vllm:generation_tokens_total") == 2
    # The refused request is an admission rejection; /health's 503 is not.
    assert value(dead, "pagedserve:admission_rejections_total", reason="engine_dead") == 1


def test_each_app_has_its_own_registry(server: LiveServer) -> None:
    # With the global registry the second app would fail with "Duplicated timeseries".
    first, second = create_app(server.config), create_app(server.config)
    assert first[METRICS_KEY].registry is not second[METRICS_KEY].registry
    assert first[METRICS_KEY].registry is not REGISTRY
