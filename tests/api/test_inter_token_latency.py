"""The inter-token-latency histogram counts every gap between two tokens of a request exactly
once, with streams read concurrently while the server's event loop falls behind the engine
(so several outputs of one request wait in its queue at once)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.client.api.sse import iter_sse
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer


async def itl_count(session: aiohttp.ClientSession, base_url: str) -> float:
    async with session.get(base_url + "/metrics") as response:
        text = await response.text()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if "inter_token_latency" in f.name and f.type == "histogram"]
    return sum(s.value for s in family.samples if s.name.endswith("_count"))


async def test_every_token_gap_is_counted_once(server: LiveServer) -> None:
    url = server.base_url + "/v1/completions"
    lengths = [3, 9, 16, 24, 40, 64]
    async with aiohttp.ClientSession() as session:

        async def stall() -> None:
            async def block_the_loop() -> None:
                time.sleep(0.3)  # the engine thread keeps stepping meanwhile

            await asyncio.sleep(0.05)
            await asyncio.to_thread(server.call, block_the_loop)

        async def stream(max_tokens: int) -> int:
            payload = {"model": MODEL, "prompt": f"stream {max_tokens}", "stream": True,
                       "max_tokens": max_tokens, "ignore_eos": True}
            async with session.post(url, json=payload) as response:
                tokens = 0
                async for event in iter_sse(response.content):
                    if not event.is_done:
                        tokens += 1
                return tokens

        async def complete(max_tokens: int) -> int:
            payload = {"model": MODEL, "prompt": "whole", "max_tokens": max_tokens,
                       "ignore_eos": True}
            async with session.post(url, json=payload) as response:
                return (await response.json())["usage"]["completion_tokens"]

        before = await itl_count(session, server.base_url)
        *counts, _ = await asyncio.gather(*(stream(n) for n in lengths), complete(10),
                                          stall())
        after = await itl_count(session, server.base_url)

    assert counts == [*lengths, 10]
    assert after - before == sum(n - 1 for n in counts)
