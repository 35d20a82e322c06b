"""Routing decisions against two fake replicas: prefix affinity, saturation, ejection and
retry, streaming pass-through and disconnects."""

from __future__ import annotations

import asyncio

import aiohttp

from pagedserve.common.load_hints import LoadHints
from pagedserve.router.hash_ring import HashRing
from pagedserve.router.prefix_key import routing_key
from pagedserve.router.proxy import REPLICA_HEADER
from tests.router.conftest import Router
from tests.router.fake_replica import garbage_server

SYSTEMS = [f"System prompt number {i}: answer as briefly as you can, please. " * 6
           for i in range(8)]
SATURATED = LoadHints(kv_cache_usage=0.5, num_waiting=9, num_running=8,
                      free_token_capacity=10, num_preemptions=0)


def home(router: Router, prompt: str) -> str:
    """The replica that owns ``prompt``'s key on the ring."""
    config = router.state.config
    key = routing_key("/v1/completions", {"prompt": prompt}, config.prefix_blocks,
                      config.block_chars, config.block_size)
    return next(HashRing(sorted(router.state.replicas.replicas)).walk(key))


def prompts_homed_on(router: Router, url: str) -> list[str]:
    """Prompts whose prefix ``url`` owns on the ring. The replicas listen on fresh ports, so
    which replica owns which prefix changes from run to run: the prompts come from as many
    systems as it takes to find some (eight alone all land on one replica now and then)."""
    systems = SYSTEMS + [f"System prompt number {i}: answer as briefly as you can, please. " * 6
                         for i in range(len(SYSTEMS), 256)]
    homed = [s + "Question?" for s in systems if home(router, s) == url]
    assert homed, f"no prefix of 256 lands on {url}"
    return homed


async def complete(http: aiohttp.ClientSession, router: Router, prompt: str,
                   ) -> tuple[int, str, dict]:
    async with http.post(router.url + "/v1/completions",
                         json={"model": "tiny", "prompt": prompt}) as response:
        return response.status, response.headers.get(REPLICA_HEADER, ""), await response.json()


async def metric(http: aiohttp.ClientSession, router: Router, name: str) -> float:
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    return 0.0


async def test_same_prefix_goes_to_the_same_replica(replicas, make_router, http) -> None:
    # By default no replica owns more than its even share of the prefixes.
    router = await make_router([r.url for r in replicas])
    first = None
    for system in SYSTEMS:
        served = set()
        for question in ("What is 2+2?", "Name a colour.", "Why?"):
            status, replica, _ = await complete(http, router, system + question)
            assert status == 200
            served.add(replica)
        (replica,) = served
        first = first or replica
    # The first prefix lands on its ring home; the eight end up four and four.
    assert first == home(router, SYSTEMS[0])
    assert router.state.policy.owners.counts() == {replicas[0].url: 4, replicas[1].url: 4}
    assert await metric(http, router, "pagedserve:router_new_prefixes_total") == 8
    assert await metric(http, router, "pagedserve:router_cache_affinity_hits_total") == 16
    for fake in replicas:
        assert await metric(http, router, "pagedserve:router_routed_requests_total"
                            f'{{replica="{fake.url}"}}') == len(fake.requests) == 12


async def test_a_saturated_replica_is_passed_over(replicas, make_router, http) -> None:
    router = await make_router([r.url for r in replicas])
    prompt = SYSTEMS[0] + "Question?"
    owner = (await complete(http, router, prompt))[1]
    fake, other = sorted(replicas, key=lambda r: r.url != owner)
    fake.hints = SATURATED
    await router.check_health()  # /load now says the owner has 9 waiting
    assert (await complete(http, router, prompt))[1] == other.url
    assert await metric(http, router, "pagedserve:router_cache_affinity_misses_total") == 1
    # New prefixes go around it too.
    assert {(await complete(http, router, s + "?"))[1] for s in SYSTEMS[1:]} == {other.url}
    # Its hints clear: the prefix goes back where it is cached.
    fake.hints = other.hints
    await router.check_health()
    assert (await complete(http, router, prompt))[1] == owner
    assert await metric(http, router, "pagedserve:router_cache_affinity_hits_total") == 1


async def test_a_hot_replica_spills_past_its_load_bound(replicas, make_router, http) -> None:
    router = await make_router([r.url for r in replicas], spill_threshold=2)
    prompt = SYSTEMS[0] + "Question?"
    owner = (await complete(http, router, prompt))[1]
    busy = router.state.replicas.replicas[owner]
    busy.in_flight = 1  # one more still fits: 2 ≤ max(ceil(1.25 × 2 / 2), 0 + 2)
    assert (await complete(http, router, prompt))[1] == owner
    busy.in_flight = 2  # 3 > max(ceil(1.25 × 3 / 2), 0 + 2): spills to the other
    assert (await complete(http, router, prompt))[1] != owner
    busy.in_flight = 0
    assert await metric(http, router, "pagedserve:router_cache_affinity_misses_total") == 1
    assert (await complete(http, router, prompt))[1] == owner  # the owner stays


async def test_every_replica_saturated_goes_to_the_least_loaded(replicas, make_router,
                                                                http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url], policy="least-load")
    a.hints = SATURATED
    b.hints = LoadHints(0.99, 1, 8, 10, 0)
    await router.check_health()
    assert (await complete(http, router, "x"))[1] == b.url  # both saturated, b waits less


async def test_a_dead_replica_is_ejected_and_the_request_retried(replicas, make_router,
                                                                 http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url])
    prompt = prompts_homed_on(router, a.url)[0]
    await a.stop()
    status, replica, body = await complete(http, router, prompt)
    assert (status, replica, body["replica"]) == (200, b.url, "b")
    assert not router.state.replicas.replicas[a.url].healthy
    assert await metric(http, router, f'pagedserve:router_retries_total{{replica="{a.url}"}}') == 1
    assert await metric(http, router, "pagedserve:router_replica_healthy"
                        f'{{replica="{a.url}"}}') == 0
    # Ejected: the next request for that prefix goes straight to b, no retry.
    await complete(http, router, prompt)
    assert await metric(http, router, f'pagedserve:router_retries_total{{replica="{a.url}"}}') == 1


async def test_a_hung_replica_is_ejected_and_its_waiting_request_retried(
        replicas, make_router, http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url], health_timeout=0.2)
    a.hang = a.health_hangs = True
    request = asyncio.create_task(complete(http, router, prompts_homed_on(router, a.url)[0]))
    while not a.requests:
        await asyncio.sleep(0.01)
    await router.check_health()  # /health times out: a is ejected
    status, replica, body = await asyncio.wait_for(request, 10)
    assert (status, replica, body["replica"]) == (200, b.url, "b")
    assert await metric(http, router, f'pagedserve:router_retries_total{{replica="{a.url}"}}') == 1
    hung = router.state.replicas.replicas[a.url]
    assert (hung.waiting, hung.cut_off) == (set(), set())


async def test_a_replica_answering_garbage_is_ejected(replicas, make_router, http) -> None:
    server, garbage_url = await garbage_server()
    try:
        router = await make_router([garbage_url, replicas[0].url], policy="round-robin")
        answers = [await complete(http, router, "hello") for _ in range(2)]
        assert [(s, r) for s, r, _ in answers] == [(200, replicas[0].url)] * 2
        assert not router.state.replicas.replicas[garbage_url].healthy
    finally:
        server.close()


async def test_a_full_replica_is_retried_elsewhere_and_all_full_passes_the_429(
        replicas, make_router, http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url], policy="round-robin")
    a.status = 429
    statuses = [(await complete(http, router, "hi"))[:2] for _ in range(2)]
    assert statuses == [(200, b.url)] * 2
    assert router.state.replicas.replicas[a.url].healthy  # full is not dead
    b.status = 429
    async with http.post(router.url + "/v1/completions", json={"prompt": "hi"}) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "1"
        assert (await response.json())["error"]["code"] == "queue_full"


async def test_streams_pass_through_unbuffered(replicas, make_router, http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url])
    prompt = prompts_homed_on(router, a.url)[0]
    async with http.post(router.url + "/v1/completions",
                         json={"prompt": prompt, "stream": True}) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        # The replica holds its second chunk back, so the first can only have come unbuffered.
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
        assert first == b'data: {"replica":"a","chunk":1}\n\n'
        a.release_stream.set()
        rest = await response.content.read()
    assert rest == b'data: {"replica":"a","chunk":2}\n\ndata: [DONE]\n\n'


async def test_a_client_disconnect_closes_the_upstream_stream(replicas, make_router,
                                                              http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url])
    prompt = prompts_homed_on(router, a.url)[0]
    response = await http.post(router.url + "/v1/completions",
                               json={"prompt": prompt, "stream": True})
    await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
    response.close()  # the client goes away mid-stream
    await asyncio.wait_for(a.stream_cancelled.wait(), 10)
    replica = router.state.replicas.replicas[a.url]
    for _ in range(100):
        if replica.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert replica.in_flight == 0
    assert replica.healthy


async def test_a_client_leaving_a_hung_replica_is_not_retried(replicas, make_router,
                                                             http) -> None:
    a, b = replicas
    router = await make_router([a.url, b.url])
    a.hang = True
    request = asyncio.create_task(complete(http, router, prompts_homed_on(router, a.url)[0]))
    while not a.requests:
        await asyncio.sleep(0.01)
    request.cancel()  # the client goes away before the replica's first byte
    replica = router.state.replicas.replicas[a.url]
    for _ in range(1000):  # a bound for a busy machine, not a speed
        if replica.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert (replica.in_flight, replica.waiting, replica.cut_off) == (0, set(), set())
    assert replica.healthy and not b.requests
    assert await metric(http, router, f'pagedserve:router_retries_total{{replica="{a.url}"}}') == 0
    # Ejected later, it has no waiting request left to move.
    router.state.replicas.eject(replica, "test")
    assert replica.cut_off == set()


async def test_headers_and_trace_context_reach_the_replica(replicas, make_router,
                                                           http) -> None:
    router = await make_router([replicas[0].url])
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with http.post(router.url + "/v1/completions", json={"prompt": "hi"},
                         headers={"traceparent": traceparent, "Authorization": "Bearer k",
                                  "X-Request-Id": "req-1"}) as response:
        assert response.status == 200
        # A replica's load hints describe the replica, not the router.
        assert not any(h.lower().startswith("x-pagedserve-kv") for h in response.headers)
    (sent,) = replicas[0].headers
    assert (sent["traceparent"], sent["Authorization"], sent["X-Request-Id"]) == (
        traceparent, "Bearer k", "req-1")


async def test_get_routes_and_health(replicas, make_router, http) -> None:
    router = await make_router([r.url for r in replicas], replica_api_key="k")
    # /load takes the replicas' key (their /health needs none).
    assert [r.load_authorization for r in replicas] == ["Bearer k"] * 2
    async with http.get(router.url + "/v1/models") as response:
        assert (response.status, (await response.json())["data"]) == (200, [{"id": "tiny"}])
    async with http.get(router.url + "/health") as response:
        assert await response.json() == {"status": "ok", "healthy_replicas": 2}


async def test_dns_name_lists_every_address(replicas, make_router, http) -> None:
    port = replicas[0].server.port
    router = await make_router([], replica_dns=f"localhost:{port}")
    assert f"http://127.0.0.1:{port}" in router.state.replicas.replicas
    status, replica, _ = await complete(http, router, "hello")
    assert (status, replica) == (200, f"http://127.0.0.1:{port}")
