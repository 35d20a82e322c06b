"""OpenTelemetry plumbing shared by the server, the router and the client.

Tracing is off unless an OTLP endpoint is given: nothing here is imported until then, and
``opentelemetry`` is an optional dependency (``pip install pagedserve[otel]``). Context
crosses processes as W3C ``traceparent`` headers, so a client's span is the parent of the
router's, and the router's of the replica's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

_HAS_OTEL_API = importlib.util.find_spec("opentelemetry") is not None


def tracer_provider(service_name: str, endpoint: str | None = None,
                    exporter: SpanExporter | None = None) -> TracerProvider:
    """A provider that exports to ``endpoint`` over OTLP/HTTP in batches, or to ``exporter``
    span by span (tests pass the SDK's in-memory exporter)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def extract(headers: Mapping[str, str]) -> Context:
    """The caller's context from its ``traceparent``/``tracestate`` headers."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier=headers)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Writes ``traceparent`` for ``context`` (the current one by default) into ``headers``;
    nothing when there is no valid span, or no OpenTelemetry installed."""
    if not _HAS_OTEL_API:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers, context=context)


@contextlib.contextmanager
def client_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[None]:
    """A CLIENT span under the current context, through the global tracer provider: a no-op
    unless the application (or ``--otlp-traces-endpoint``) installed one."""
    if not _HAS_OTEL_API:
        yield
        return
    from opentelemetry import trace

    tracer = trace.get_tracer("pagedserve.client")
    with tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT,
                                      attributes=dict(attributes or {})):
        yield


def epoch_offset_ns() -> int:
    """What to add to ``time.monotonic()`` nanoseconds to get the wall-clock nanoseconds
    spans are stamped in; taken once per trace so that its spans line up exactly."""
    return time.time_ns() - time.monotonic_ns()
