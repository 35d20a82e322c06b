"""The HTTP server's own settings; the engine's live in ``EngineArgs``."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.common.http.forwarded import X_FORWARDED_FOR, TrustedProxies
from pagedserve.server.api.http.limits import ServerConfigError, ServerLimits
from pagedserve.server.api.tools.formats import AUTO, TOOL_FORMATS
from pagedserve.server.engine.config.engine_args import EngineArgs

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class ServerConfig:
    """What ``create_app`` needs besides the engine arguments.

    ``served_model_names`` are the names clients may put in ``model``; the first one is the
    name responses carry. Empty means the engine's model name. ``api_key``: one key or
    several (each its own tenant for the per-client limits). ``health_port``: a second port
    that serves only ``/health`` and ``/metrics``, outside the main port's connection cap.
    ``allow_special_tokens_in_content``: let special-token text in chat messages become
    special ids (by default it stays text, so no message can forge a turn).
    ``forwarded_allow_ips``: the proxies (addresses, CIDR networks, or ``*``) whose
    ``forwarded_header`` names the client for the per-client limits and the tenant key;
    none by default, so that no client can name itself. ``stream_keepalive_interval``: a
    stream silent this many seconds gets an SSE comment (a long queue wait or prefill keeps
    proxies' idle timers from firing) while its engine is not stalled.
    ``engine_stall_timeout``: seconds the engine may go without finishing a step while it
    holds requests before ``/health`` answers 503 and streams stop their keep-alive comments
    (a hung step behind a live HTTP loop).
    """

    engine_args: EngineArgs = field(default_factory=EngineArgs)
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | list[str] | None = None
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    drain_timeout: float = 30.0
    limits: ServerLimits = field(default_factory=ServerLimits)
    tool_call_parser: str = AUTO
    health_port: int | None = None
    allow_special_tokens_in_content: bool = False
    forwarded_allow_ips: list[str] = field(default_factory=list)
    forwarded_header: str = X_FORWARDED_FOR
    # OpenTelemetry traces go to this OTLP/HTTP endpoint; None: no tracing.
    otlp_traces_endpoint: str | None = None
    # The web page at / and the engine's state at /engine/state (--disable-web-ui: neither).
    web_ui: bool = True
    stream_keepalive_interval: float = 10.0
    engine_stall_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.tool_call_parser not in (AUTO, *TOOL_FORMATS):
            raise ServerConfigError(f"tool_call_parser must be one of {AUTO}, "
                                    f"{', '.join(TOOL_FORMATS)}, got {self.tool_call_parser!r}")
        if not 0 <= self.port <= 65535:
            raise ServerConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_request_body_bytes < 1:
            raise ServerConfigError(
                f"max_request_body_bytes must be at least 1, got {self.max_request_body_bytes}"
            )
        if self.drain_timeout < 0:
            raise ServerConfigError(
                f"drain_timeout must be non-negative, got {self.drain_timeout}"
            )
        for name in ("stream_keepalive_interval", "engine_stall_timeout"):
            if getattr(self, name) <= 0:
                raise ServerConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.api_key == "" or (isinstance(self.api_key, list)
                                  and (not self.api_key or "" in self.api_key)):
            raise ServerConfigError("api_key must be non-empty when given")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ServerConfigError(f"health_port must be in [0, 65535], got {self.health_port}")
        try:
            self.trusted_proxies()
        except ValueError as exc:
            raise ServerConfigError(str(exc)) from None
        if any(not name for name in self.served_model_names):
            raise ServerConfigError(
                f"served model names must be non-empty, got {self.served_model_names!r}"
            )

    def trusted_proxies(self) -> TrustedProxies:
        return TrustedProxies(self.forwarded_allow_ips, self.forwarded_header)
