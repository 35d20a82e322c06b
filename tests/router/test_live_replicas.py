"""The router in front of two real replicas of the tiny checkpoint: a shared system prompt
lands where it is cached, answers and streams are the replica's own, and a client that leaves
aborts the generation at the replica."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import aiohttp
import orjson
import pytest

from pagedserve.common.load_hints import HEADER_KEEPALIVE
from pagedserve.router.proxy import REPLICA_HEADER
from tests.api.live_server import LiveServer
from tests.live_model import MODEL

SYSTEMS = [f"You are assistant number {i}. Keep every answer short and plain. " * 5
           for i in range(3)]
QUESTIONS = ["What is a block?", "Say something."]


def chat(system: str, question: str, **extra: object) -> dict:
    return {"model": MODEL, "max_tokens": 4, "temperature": 0, **extra,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}


async def test_shared_prompts_hit_the_prefix_cache_of_their_replica(
        live_replicas: list[LiveServer], make_router, http: aiohttp.ClientSession) -> None:
    by_url = {s.base_url: s for s in live_replicas}
    router = await make_router(list(by_url))
    before = {url: s.engine.stats().prefix_cache_hits for url, s in by_url.items()}
    served: dict[str, set[str]] = defaultdict(set)
    repeats: dict[str, int] = defaultdict(int)
    for system in SYSTEMS:
        for question in QUESTIONS:
            async with http.post(router.url + "/v1/chat/completions",
                                 json=chat(system, question)) as response:
                assert response.status == 200, await response.text()
                served[system].add(response.headers[REPLICA_HEADER])
        (url,) = served[system]  # every question of one system prompt on one replica
        repeats[url] += len(QUESTIONS) - 1
    for url, server in by_url.items():
        hits = server.engine.stats().prefix_cache_hits - before[url]
        # Each repeated system prompt found at least its first block cached.
        assert hits >= 16 * repeats[url], (url, hits, repeats[url])


async def test_answers_and_streams_are_the_replicas_own(
        live_replicas: list[LiveServer], make_router, http: aiohttp.ClientSession) -> None:
    router = await make_router([s.base_url for s in live_replicas])
    body = chat(SYSTEMS[0], QUESTIONS[0], max_tokens=8)
    async with http.post(live_replicas[0].base_url + "/v1/chat/completions",
                         json=body) as response:
        direct = (await response.json())["choices"][0]["message"]["content"]
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert (await response.json())["choices"][0]["message"]["content"] == direct
    async with http.post(router.url + "/v1/chat/completions",
                         json={**body, "stream": True}) as response:
        assert response.content_type == "text/event-stream"
        events = [line[6:] async for line in response.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"[DONE]"
    deltas = [orjson.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
    assert "".join(deltas) == direct


async def test_a_client_leaving_mid_stream_aborts_at_the_replica(
        live_replicas: list[LiveServer], make_router, http: aiohttp.ClientSession) -> None:
    router = await make_router([s.base_url for s in live_replicas], policy="round-robin")
    long = {"model": MODEL, "prompt": "a long story", "max_tokens": 1000, "ignore_eos": True,
            "temperature": 0, "stream": True}
    response = await http.post(router.url + "/v1/completions", json=long)
    assert response.status == 200
    server = next(s for s in live_replicas if s.base_url == response.headers[REPLICA_HEADER])
    before = server.engine.stats()
    for _ in range(3):
        assert (await response.content.readline()).startswith(b"data: {")
        await response.content.readline()
    response.close()
    after = await asyncio.to_thread(
        server.wait_until, lambda s: s.num_running == 0 and s.num_waiting == 0)
    assert after.kv_cache_usage == 0.0
    # Stopped far short of its 1000 tokens: aborted, not run to the end.
    assert after.generation_tokens_total - before.generation_tokens_total < 1000


@pytest.mark.parametrize("asks_for_comments", [False, True])
async def test_a_prefill_longer_than_the_idle_timeout_is_kept_alive(
        live_replicas: list[LiveServer], make_router, http: aiohttp.ClientSession,
        monkeypatch, asks_for_comments: bool) -> None:
    server = live_replicas[0]
    router = await make_router([server.base_url], stream_idle_timeout=0.6)
    monkeypatch.setattr(server.config, "stream_keepalive_interval", 0.2)
    engine = server.engine.engine
    step = engine.step

    def slow_first_step() -> object:
        time.sleep(1.5)  # the prefill: longer than the router's idle timeout
        monkeypatch.setattr(engine, "step", step)
        return step()

    monkeypatch.setattr(engine, "step", slow_first_step)
    body = {"model": MODEL, "prompt": "a long prompt", "max_tokens": 3, "ignore_eos": True,
            "temperature": 0, "stream": True}
    headers = {HEADER_KEEPALIVE: "1"} if asks_for_comments else {}
    async with http.post(router.url + "/v1/completions", json=body,
                         headers=headers) as response:
        raw = await response.read()
    events = raw.split(b"\n\n")
    # The replica's comments kept the router's timer alive while the prefill ran; they reach
    # only a client that asked for them, as the server's own do.
    assert (events[0] == b": keep-alive") is asks_for_comments
    assert asks_for_comments or not any(e.startswith(b":") for e in events)
    data = [e for e in events if e.startswith(b"data: ")]
    assert data[-1] == b"data: [DONE]"
    assert len(data) == 4 and all(b'"text"' in e for e in data[:-1])
