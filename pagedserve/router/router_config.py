"""The router's settings, checked once when built."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("prefix", "least-load", "round-robin")


@dataclass(slots=True)
class RouterConfig:
    replicas: list[str] = field(default_factory=list)
    # "host:port" of a name that resolves to every replica (a Kubernetes headless service).
    replica_dns: str | None = None
    policy: str = "prefix"
    host: str = "0.0.0.0"
    port: int = 8080
    # Prefix policy: the key is the chained hash of the prompt's leading blocks; a text block
    # is ``block_chars`` characters, a token-id prompt's block is ``block_size`` ids.
    prefix_blocks: int = 4
    block_chars: int = 64
    block_size: int = 16
    # Bounded load: no replica takes more than ``load_factor`` × the mean in-flight count.
    load_factor: float = 1.25
    # ...and holds at least ``spill_threshold`` more than the least loaded replica.
    spill_threshold: int = 8
    # New prefixes: no replica owns more than ``prefix_load_factor`` × the mean number of
    # recent prefixes. 1.0 splits them as evenly as the count allows (8 prefixes on two
    # replicas: 4 and 4); above it the ring's choice wins more often, at the cost of one
    # replica caching more prefixes than the other (5 and 3: one thrashes while one idles).
    prefix_load_factor: float = 1.0
    # Recent prefixes whose replica the router remembers (LRU).
    max_tracked_prefixes: int = 65536
    # A replica counts as saturated when its hints say so; the prefix choice then moves on.
    max_waiting: int = 4
    max_kv_usage: float = 0.95
    health_interval: float = 2.0
    health_timeout: float = 2.0
    dns_interval: float = 5.0
    connect_timeout: float = 5.0
    # How long a replica may take to send response headers (a non-streamed answer's whole
    # generation) before the router gives up on it.
    upstream_timeout: float = 600.0
    max_attempts: int = 3
    max_in_flight: int = 1024
    max_request_body_bytes: int = 16 * 1024 * 1024
    otlp_traces_endpoint: str | None = None
    # The page at / and its state at /router/state (--disable-web-ui: neither).
    web_ui: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not self.replicas and not self.replica_dns:
            raise ValueError("give at least one --replica URL or --replica-dns HOST:PORT")
        if self.replica_dns is not None:
            _host, sep, port = self.replica_dns.rpartition(":")
            if not sep or not port.isdigit():
                raise ValueError(f"--replica-dns must be HOST:PORT, got {self.replica_dns!r}")
        for name in ("prefix_blocks", "block_chars", "block_size", "max_attempts",
                     "max_tracked_prefixes",
                     "max_in_flight", "max_request_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.spill_threshold < 0:
            raise ValueError(f"spill_threshold must be non-negative, got {self.spill_threshold}")
        for name in ("load_factor", "prefix_load_factor"):
            if getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be at least 1.0, got {getattr(self, name)}")
        self.replicas = [url.rstrip("/") for url in self.replicas]
