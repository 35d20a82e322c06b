"""Traces across client → router → replica: one trace, each hop's span the child of the one
before (W3C traceparent), and the replica's phase spans from the engine's own timestamps.
Exported to the SDK's in-memory exporter, and once over OTLP/HTTP to a local receiver."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pagedserve.client import AsyncClient
from pagedserve.common import otel
from pagedserve.router import RouterConfig
from pagedserve.router.tracing import OtelTracing, tracing_for
from pagedserve.server.api import create_app
from pagedserve.server.api.telemetry.tracing import TRACING_KEY, ServerTracing
from tests.api.live_server import LiveServer, server_config
from tests.live_model import MODEL
from tests.router.conftest import start_router


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def traced_replica(model_dir: Path, exporter: InMemorySpanExporter) -> Iterator[LiveServer]:
    tracing = ServerTracing(otel.tracer_provider("pagedserve-server", exporter=exporter))
    server = LiveServer(server_config(str(model_dir)), tracing).start()
    yield server
    server.stop()


def one(spans: list[ReadableSpan], name: str, service: str) -> ReadableSpan:
    (found,) = [s for s in spans
                if s.name == name and s.resource.attributes["service.name"] == service]
    return found


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


async def test_one_trace_from_client_to_engine_phases(traced_replica: LiveServer,
                                                      exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    router_provider = otel.tracer_provider("pagedserve-router", exporter=exporter)
    router = await start_router([traced_replica.base_url], OtelTracing(router_provider))
    app_tracer = otel.tracer_provider("app", exporter=exporter).get_tracer("app")
    try:
        async with AsyncClient(router.url + "/v1", api_key="unused") as client:
            with app_tracer.start_as_current_span("app") as app_span:
                completion = await client.completions.create(
                    model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0,
                    ignore_eos=True)
    finally:
        await router.close()
    spans = list(exporter.get_finished_spans())
    routed = one(spans, "POST /v1/completions", "pagedserve-router")
    served = one(spans, "POST /v1/completions", "pagedserve-server")
    request = one(spans, "llm_request", "pagedserve-server")
    phases = {name: one(spans, name, "pagedserve-server")
              for name in ("queue", "prefill", "decode", "response")}
    # One trace; each hop the child of the one before.
    assert {s.context.trace_id for s in (routed, served, request, *phases.values())} == {
        app_span.get_span_context().trace_id}
    assert parent_of(routed) == app_span.get_span_context().span_id
    assert parent_of(served) == routed.context.span_id
    assert routed.kind == served.kind == trace.SpanKind.SERVER
    assert routed.attributes["pagedserve.router.replica"] == traced_replica.base_url
    assert served.attributes["http.response.status_code"] == 200
    assert parent_of(request) == served.context.span_id
    assert parent_of(phases["response"]) == served.context.span_id
    for name in ("queue", "prefill", "decode"):
        assert parent_of(phases[name]) == request.context.span_id
    # The phases tile the request, from the engine's timestamps.
    queue, prefill, decode = phases["queue"], phases["prefill"], phases["decode"]
    assert request.start_time == queue.start_time
    assert queue.end_time == prefill.start_time
    assert prefill.end_time == decode.start_time
    assert decode.end_time <= request.end_time <= phases["response"].start_time
    usage = completion.usage
    attributes = request.attributes
    assert (attributes["gen_ai.usage.prompt_tokens"],
            attributes["gen_ai.usage.completion_tokens"]) == (usage.prompt_tokens, 5)
    assert attributes["gen_ai.request.max_tokens"] == 5
    # The engine's id of the request (prompt 0 of the completion).
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}-0", attributes["gen_ai.request.id"])
    assert attributes["gen_ai.response.model"] == MODEL


async def test_otlp_export_reaches_a_receiver(replicas) -> None:
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    receiver = TestServer(app, host="127.0.0.1")
    await receiver.start_server()
    try:
        endpoint = f"http://127.0.0.1:{receiver.port}/v1/traces"
        config = RouterConfig(replicas=[replicas[0].url], otlp_traces_endpoint=endpoint)
        router = await start_router([replicas[0].url], tracing_for(config, "pagedserve-router"))
        async with aiohttp.ClientSession() as http, http.post(
                router.url + "/v1/completions", json={"prompt": "hi"}) as response:
            assert response.status == 200
        await router.close()  # the router's cleanup flushes its batch of spans
    finally:
        await receiver.close()
    spans = [(resource.resource, span) for message in received
             for resource in message.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    (only,) = spans
    resource, span = only
    assert span.name == "POST /v1/completions"
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "pagedserve-router"
    # The replica saw the router's span as its parent.
    (headers,) = replicas[0].headers
    assert headers["traceparent"].split("-")[2] == span.span_id.hex()


def test_tracing_is_off_without_an_endpoint(model_dir: Path) -> None:
    assert TRACING_KEY not in create_app(server_config(str(model_dir)))
    config = RouterConfig(replicas=["http://a:8000"])
    assert type(tracing_for(config, "pagedserve-router")).__name__ == "Tracing"
    with_endpoint = server_config(str(model_dir), otlp_traces_endpoint="http://c:4318/v1/traces")
    assert isinstance(create_app(with_endpoint)[TRACING_KEY], ServerTracing)
