"""Request traces, as vLLM exports them: built at the API layer from the engine's own
timestamps, so the engine's step makes no tracing calls.

Each generation request gets a SERVER span (its parent the caller's ``traceparent``). Each
engine request under it gets an ``llm_request`` span from arrival to finish with the token
counts and request id, and children for its phases: ``queue`` (arrival → first scheduled),
``prefill`` (→ first token) and ``decode`` (→ last token). A ``response`` span covers the
time from the last output to the handler's end: serializing and writing the answer.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pagedserve.common import otel
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

TRACED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class _HttpTrace:
    last_output_ns: int | None = None


_CURRENT: contextvars.ContextVar[_HttpTrace | None] = contextvars.ContextVar(
    "pagedserve_http_trace", default=None)


class ServerTracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("pagedserve.server")

    @classmethod
    def from_endpoint(cls, endpoint: str) -> ServerTracing:
        return cls(otel.tracer_provider("pagedserve-server", endpoint))

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def trace_request(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path not in TRACED_PATHS:
                return await handler(request)
            return await self._traced(request, handler)

        return trace_request

    async def _traced(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        from opentelemetry import trace

        span = self.tracer.start_span(
            f"{request.method} {request.path}", context=otel.extract(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": request.method, "http.route": request.path})
        http_trace = _HttpTrace()
        token = _CURRENT.set(http_trace)
        try:
            with trace.use_span(span, end_on_exit=False):
                response = await handler(request)
                span.set_attribute("http.response.status_code", response.status)
                if http_trace.last_output_ns is not None:
                    self.tracer.start_span("response", start_time=http_trace.last_output_ns
                                           ).end()
                return response
        finally:
            _CURRENT.reset(token)
            span.end()

    def request_finished(self, output: RequestOutput, params: SamplingParams,
                         model: str) -> None:
        """The spans of one finished engine request, under the current HTTP span."""
        m = output.metrics
        end = m.finished_time if m.finished_time is not None else time.monotonic()
        attributes: dict[str, Any] = {
            "gen_ai.request.id": output.request_id,
            "gen_ai.response.model": model,
            "gen_ai.usage.prompt_tokens": len(output.prompt_token_ids),
            "gen_ai.usage.completion_tokens": sum(len(o.token_ids) for o in output.outputs),
            "gen_ai.usage.cached_prompt_tokens": output.num_cached_tokens,
            "gen_ai.request.n": params.n,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
        }
        if params.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = params.max_tokens
        for name, value in (("time_in_queue", m.queue_time),
                            ("time_to_first_token", m.time_to_first_token),
                            ("e2e", end - m.arrival_time)):
            if value is not None:
                attributes[f"gen_ai.latency.{name}"] = value
        offset = otel.epoch_offset_ns()

        def ns(monotonic_s: float) -> int:
            return offset + int(monotonic_s * 1e9)

        parent = self.tracer.start_span("llm_request", start_time=ns(m.arrival_time),
                                        attributes=attributes)
        from opentelemetry import trace

        context = trace.set_span_in_context(parent)
        for name, start, stop in (("queue", m.arrival_time, m.first_scheduled_time),
                                  ("prefill", m.first_scheduled_time, m.first_token_time),
                                  ("decode", m.first_token_time, m.last_token_time)):
            if start is not None and stop is not None:
                span = self.tracer.start_span(name, context=context, start_time=ns(start),
                                              attributes={"gen_ai.request.id":
                                                          output.request_id})
                span.end(end_time=ns(stop))
        parent.end(end_time=ns(end))
        http_trace = _CURRENT.get()
        if http_trace is not None:
            http_trace.last_output_ns = time.time_ns()


# Present only when tracing is on (this module loads OpenTelemetry lazily).
TRACING_KEY = web.AppKey("tracing", ServerTracing)
