"""The router's traces: one SERVER span per routed request, child of the client's
``traceparent`` and parent of the replica's (the router forwards its own span's context).
Off unless ``--otlp-traces-endpoint`` is given; then OpenTelemetry loads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pagedserve.common import otel

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from pagedserve.router.router_config import RouterConfig


_NO_SPAN = contextlib.nullcontext()


class Tracing:
    """Off: no spans, and the client's ``traceparent`` passes through with the headers."""

    def span(self, request: web.Request, route: Any) -> AbstractContextManager[None]:
        return _NO_SPAN  # one reusable context, not a generator per request

    def inject(self, headers: MutableMapping[str, str]) -> None:
        return None

    def shutdown(self) -> None:
        return None


class OtelTracing(Tracing):
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("pagedserve.router")

    @contextlib.contextmanager
    def span(self, request: web.Request, route: Any) -> Iterator[None]:
        from opentelemetry import trace

        attributes = {"http.request.method": request.method, "http.route": request.path}
        if route.affinity:
            attributes["pagedserve.router.affinity"] = route.affinity
        if route.replicas:
            attributes["pagedserve.router.replica"] = route.replicas[0].url
        with self.tracer.start_as_current_span(
                f"{request.method} {request.path}", context=otel.extract(request.headers),
                kind=trace.SpanKind.SERVER, attributes=attributes):
            yield

    def inject(self, headers: MutableMapping[str, str]) -> None:
        # The client's traceparent is replaced by the router span's own.
        for name in ("traceparent", "tracestate"):
            while name in headers:  # the router's headers are case-insensitive
                del headers[name]
        otel.inject(headers)

    def shutdown(self) -> None:
        self.provider.shutdown()


def tracing_for(config: RouterConfig, service_name: str) -> Tracing:
    if not config.otlp_traces_endpoint:
        return Tracing()
    return OtelTracing(otel.tracer_provider(service_name, config.otlp_traces_endpoint))
