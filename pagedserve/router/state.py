"""What the router's handlers share, held in one typed ``web.AppKey``."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from pagedserve.common.http.forwarded import TrustedProxies
from pagedserve.router.metrics import RouterMetrics
from pagedserve.router.policies import LeastLoad, PrefixAffinity, RoundRobin, make_policy
from pagedserve.router.replicas import ReplicaSet
from pagedserve.router.router_config import RouterConfig
from pagedserve.router.tracing import Tracing


@dataclass(slots=True)
class RouterState:
    config: RouterConfig
    replicas: ReplicaSet
    metrics: RouterMetrics
    policy: RoundRobin | LeastLoad | PrefixAffinity
    any_replica: LeastLoad
    tracing: Tracing
    # The proxies whose X-Forwarded-For names the client (``--forwarded-allow-ips``).
    proxies: TrustedProxies
    session: aiohttp.ClientSession = field(init=False)
    in_flight: int = 0

    @classmethod
    def build(cls, config: RouterConfig, tracing: Tracing) -> RouterState:
        replicas = ReplicaSet(config)
        return cls(config, replicas, RouterMetrics(replicas), make_policy(config),
                   LeastLoad(config), tracing, config.trusted_proxies())

    @classmethod
    def of(cls, request: web.Request) -> RouterState:
        return request.app[STATE_KEY]


STATE_KEY = web.AppKey("router_state", RouterState)
