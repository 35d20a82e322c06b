"""The router's page: ``/`` and its files, and ``/router/state`` with each replica's health,
traffic, load hints and prefix-cache hit rate (from the replica's /metrics), and the
router's cache-affinity counts; ``web_ui=False`` serves none of it."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from tests.router.fake_replica import IDLE, FakeReplica

METRICS = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="tiny"} 400.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="tiny"} 96.0
"""


async def vllm_metrics(request: web.Request) -> web.Response:
    return web.Response(text=METRICS)


async def test_the_page_and_its_files_load(make_router, replicas: list[FakeReplica],
                                           http: aiohttp.ClientSession) -> None:
    router = await make_router([r.url for r in replicas])
    for path, needle in (("/", b'src="/ui/router.js"'), ("/ui/router.js", b"/router/state"),
                         ("/ui/style.css", b"table")):
        async with http.get(router.url + path) as response:
            assert response.status == 200
            assert needle in await response.read()
    async with http.get(router.url + "/ui/page.py") as response:
        assert response.status == 404


async def test_the_state_reports_each_replica(make_router, replicas: list[FakeReplica],
                                              http: aiohttp.ClientSession) -> None:
    b = replicas[1]  # b has no /metrics; a serves vLLM's counters
    a = FakeReplica("m")
    a.server.app.router.add_get("/metrics", vllm_metrics)
    await a.start()
    dead = "http://127.0.0.1:9"  # nothing listens: ejected at the first health check
    try:
        router = await make_router([a.url, b.url, dead], policy="round-robin")
        await router.check_health()
        for _ in range(2):
            async with http.post(router.url + "/v1/completions",
                                 json={"model": "tiny", "prompt": "hi"}) as response:
                assert response.status == 200
        async with http.get(router.url + "/router/state") as response:
            state = await response.json()
    finally:
        await a.stop()
    assert state == {
        "object": "router.state", "policy": "round-robin", "in_flight": 0,
        "max_in_flight": 1024, "affinity": {"hit": 0, "miss": 0, "new": 0},
        "replicas": [
            {"url": a.url, "healthy": True, "ejections": 0, "in_flight": 0, "routed": 1,
             "hints": IDLE.to_json(), "prefix_cache_hit_rate": 96 / 400},
            {"url": b.url, "healthy": True, "ejections": 0, "in_flight": 0, "routed": 1,
             "hints": IDLE.to_json(), "prefix_cache_hit_rate": None},
            {"url": dead, "healthy": False, "ejections": 1, "in_flight": 0, "routed": 0,
             "hints": None, "prefix_cache_hit_rate": None},
        ],
    }


async def test_without_the_web_ui_there_is_no_page(make_router, replicas: list[FakeReplica],
                                                   http: aiohttp.ClientSession) -> None:
    router = await make_router([r.url for r in replicas], web_ui=False)
    for path in ("/", "/router/state"):
        async with http.get(router.url + path) as response:
            assert response.status == 404


def test_the_flag_turns_the_page_off() -> None:
    import argparse

    from pagedserve.router.cli import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    replica = ["--replica", "http://127.0.0.1:8000"]
    assert config_from_args(parser.parse_args(replica)).web_ui is True
    assert config_from_args(parser.parse_args([*replica, "--disable-web-ui"])).web_ui is False
