"""The router's web page: ``/`` and its files under ``/ui/``, and ``/router/state``.

The state lists each replica as the router sees it (health, ejections, requests in flight
through it and routed to it, the load hints it last sent) with its prefix-cache hit rate,
read from the replica's own ``/metrics`` when the page asks (the vLLM counter names, so a
vLLM replica shows one too), and the router's cache-affinity counts. Like ``/health`` and
``/metrics``, it needs no key: the router holds none.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.common.http.static_page import add_static_page
from pagedserve.router.metrics import PREFIX
from pagedserve.router.policies import AFFINITY_HIT, AFFINITY_MISS, AFFINITY_NEW
from pagedserve.router.replicas import Replica
from pagedserve.router.state import RouterState

STATIC_DIR = Path(__file__).parent / "static"
STATE_PATH = "/router/state"
_HITS, _QUERIES = "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"
_AFFINITY = {AFFINITY_HIT: "cache_affinity_hits", AFFINITY_MISS: "cache_affinity_misses",
             AFFINITY_NEW: "new_prefixes"}


def add_router_page(router: web.UrlDispatcher) -> None:
    add_static_page(router, STATIC_DIR)
    router.add_get(STATE_PATH, router_state)


async def router_state(request: web.Request) -> web.Response:
    state = RouterState.of(request)
    replicas = list(state.replicas.replicas.values())
    hit_rates = await asyncio.gather(*(_hit_rate(state, r) for r in replicas))
    registry = state.metrics.registry
    body = {
        "object": "router.state",
        "policy": state.config.policy,
        "in_flight": state.in_flight,
        "max_in_flight": state.config.max_in_flight,
        "affinity": {key: int(registry.get_sample_value(f"{PREFIX}{name}_total") or 0)
                     for key, name in _AFFINITY.items()},
        "replicas": [_replica(state, r, rate) for r, rate in zip(replicas, hit_rates)],
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _replica(state: RouterState, replica: Replica, hit_rate: float | None) -> dict[str, Any]:
    routed = state.metrics.registry.get_sample_value(
        f"{PREFIX}routed_requests_total", {"replica": replica.url})
    hints = replica.hints
    return {
        "url": replica.url,
        "healthy": replica.healthy,
        "ejections": replica.ejections,
        "in_flight": replica.in_flight,
        "routed": int(routed or 0),
        "hints": None if hints is None else hints.to_json(),
        "prefix_cache_hit_rate": hit_rate,
    }


async def _hit_rate(state: RouterState, replica: Replica) -> float | None:
    """Hits over queried tokens from the replica's /metrics; None when unknown."""
    if not replica.healthy:
        return None
    timeout = aiohttp.ClientTimeout(total=state.config.health_timeout)
    try:
        async with state.session.get(replica.url + "/metrics", timeout=timeout) as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None
    totals = {_HITS + "_total": 0.0, _QUERIES + "_total": 0.0}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
    except ValueError:  # not Prometheus text
        return None
    hits, queries = totals.values()
    return hits / queries if queries else None
