"""The router's settings, checked once when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.common.http.forwarded import TrustedProxies

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
    # How long a replica may stay silent on a non-streamed request (its whole generation)
    # before the router gives up on it.
    upstream_timeout: float = 600.0
    # ...and on a streamed one, before its first byte and between any two chunks; pagedserve
    # replicas send a keep-alive comment every 10 s through a long queue wait or prefill.
    stream_idle_timeout: float = 30.0
    # Failures in a row (a 5xx, reset, timeout, stall, stream cut short) that eject a replica.
    failures_to_eject: int = 2
    max_attempts: int = 3
    max_in_flight: int = 1024
    max_request_body_bytes: int = 16 * 1024 * 1024
    # The router's own front, as the server's: connections in all and per client address
    # (behind ``forwarded_allow_ips``, per client the proxies name, for requests), the time a
    # connection gets for its first request head, for a body, and idle between requests.
    max_connections: int = 4096
    max_connections_per_client: int = 1024
    max_requests_per_client: int = 512
    timeout_header_read: float = 10.0
    timeout_body_read: float = 60.0
    timeout_keep_alive: float = 5.0
    forwarded_allow_ips: list[str] = field(default_factory=list)
    # A second port for /health and /metrics only, outside the connection caps.
    health_port: int | None = None
    # The bearer token the replicas require (for their /load); requests carry their own.
    replica_api_key: str | None = None
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
                     "max_tracked_prefixes", "failures_to_eject", "max_in_flight",
                     "max_request_body_bytes", "max_connections", "max_connections_per_client",
                     "max_requests_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("health_interval", "health_timeout", "connect_timeout", "upstream_timeout",
                     "stream_idle_timeout", "timeout_header_read", "timeout_body_read",
                     "timeout_keep_alive"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health_port must be in [0, 65535], got {self.health_port}")
        self.trusted_proxies()  # raises for an entry that is not an address or a network
        if self.spill_threshold < 0:
            raise ValueError(f"spill_threshold must be non-negative, got {self.spill_threshold}")
        for name in ("load_factor", "prefix_load_factor"):
            if getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be at least 1.0, got {getattr(self, name)}")
        self.replicas = [url.rstrip("/") for url in self.replicas]

    def trusted_proxies(self) -> TrustedProxies:
        return TrustedProxies(self.forwarded_allow_ips)
