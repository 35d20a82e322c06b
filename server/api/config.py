"""The HTTP server's own settings; the engine's live in ``EngineArgs``."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.server.engine.engine_args import EngineArgs

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024


class ServerConfigError(ValueError):
    """A server setting outside its allowed range."""


@dataclass(slots=True)
class ServerConfig:
    """What ``create_app`` needs besides the engine arguments.

    ``served_model_names`` are the names clients may put in ``model``; the first one is the
    name responses carry. Empty means the engine's model name.
    """

    engine_args: EngineArgs = field(default_factory=EngineArgs)
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    drain_timeout: float = 30.0

    def __post_init__(self) -> None:
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
        if self.api_key == "":
            raise ServerConfigError("api_key must be non-empty when given")
        if any(not name for name in self.served_model_names):
            raise ServerConfigError(
                f"served model names must be non-empty, got {self.served_model_names!r}"
            )
