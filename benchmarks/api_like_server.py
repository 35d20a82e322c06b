"""An OpenAI-like completions endpoint for client benchmarks: what a hosted API looks like
from the client's side, with none of a local server's compute.

Every request takes a fixed ``latency_s`` (the model's time, spent elsewhere) and is charged
``prompt tokens + max_tokens`` against a tokens-per-minute limit. The limit is a token bucket
that refills continuously and holds one second's worth, as hosted APIs pace their limits; a
request the bucket cannot cover gets a 429 with ``Retry-After`` and ``retry-after-ms`` saying
when it would fit. Prompts are token-id lists, so client and server count alike. It runs on
its own thread and event loop, and sends no load hints.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import orjson
from aiohttp import web


class TokenBucket:
    def __init__(self, per_minute: float, now: float) -> None:
        self.per_second = per_minute / 60.0
        self.capacity = self.per_second  # one second's worth
        self.level = self.capacity
        self.updated = now

    def try_take(self, cost: float, now: float) -> float:
        """0 when ``cost`` was taken; otherwise the seconds until it would fit."""
        self.level = min(self.capacity, self.level + (now - self.updated) * self.per_second)
        self.updated = now
        need = min(cost, self.capacity)
        if self.level >= need:
            self.level -= cost
            return 0.0
        return (need - self.level) / self.per_second


class ApiLikeServer:
    def __init__(self, latency_s: float, tokens_per_minute: float) -> None:
        self.latency_s = latency_s
        self.tokens_per_minute = tokens_per_minute
        self.admitted_tokens = 0
        self.rate_limited = 0
        self.port = 0
        self._bucket = TokenBucket(tokens_per_minute, time.monotonic())
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def burst_tokens(self) -> float:
        return self._bucket.capacity

    def __enter__(self) -> ApiLikeServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the API-like server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": "api-like", "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt_tokens = len(body["prompt"])
        completion_tokens = int(body["max_tokens"])
        cost = prompt_tokens + completion_tokens
        wait = self._bucket.try_take(cost, time.monotonic())
        if wait > 0:
            self.rate_limited += 1
            error = {"error": {"message": f"Rate limit reached for tokens per min: limit "
                               f"{self.tokens_per_minute:.0f}, requested {cost}",
                               "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}
            headers = {"Retry-After": str(math.ceil(wait)),
                       "retry-after-ms": str(math.ceil(wait * 1000))}
            return _json(error, status=429, headers=headers)
        self.admitted_tokens += cost
        await asyncio.sleep(self.latency_s)
        return _json({
            "id": f"cmpl-{id(request):x}", "object": "text_completion",
            "created": int(time.time()), "model": body.get("model", "api-like"),
            "choices": [{"index": 0, "text": " ok" * completion_tokens,
                         "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": cost},
        })


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers=headers,
                        content_type="application/json")
