"""A fake replica: pagedserve's routes, answers that name the replica, load hints a test sets,
a stream a test can hold open, and faults a test turns on: generation or /health that hang,
an error status."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from pagedserve.common.load_hints import LoadHints

IDLE = LoadHints(kv_cache_usage=0.1, num_waiting=0, num_running=0, free_token_capacity=1000,
                 num_preemptions=0)


class FakeReplica:
    def __init__(self, name: str) -> None:
        self.name = name
        self.hints = IDLE
        self.status = 200  # what the generation routes answer
        self.error_code = "queue_full"  # the error's code when the status is not 200
        self.hang = False  # generation waits (before its first byte) until the test ends
        self.health_hangs = False  # /health waits until the test ends
        self.load_authorization: str | None = None  # what the last GET /load presented
        self.requests: list[dict] = []
        self.headers: list[CIMultiDict[str]] = []
        self.release_stream = asyncio.Event()  # the stream's second chunk waits for it
        self.stream_cancelled = asyncio.Event()
        app = web.Application()
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
            app.router.add_post(path, self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/load", self._load)
        app.router.add_get("/v1/models", self._models)
        app.on_response_prepare.append(self._add_hints)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> FakeReplica:
        await self.server.start_server()
        self.url = f"http://127.0.0.1:{self.server.port}"
        return self

    async def stop(self) -> None:
        await self.server.close()

    async def _add_hints(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(self.hints.to_headers())

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_hangs:
            await self.release_stream.wait()
        return web.json_response({"status": "ok"})

    async def _load(self, request: web.Request) -> web.Response:
        self.load_authorization = request.headers.get("Authorization")
        return web.json_response(self.hints.to_json())

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny"}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(CIMultiDict(request.headers))
        if self.hang:
            await self.release_stream.wait()
        if self.status != 200:
            error = {"error": {"message": "busy", "type": "rate_limit_error", "param": None,
                               "code": self.error_code}}
            return web.json_response(error, status=self.status, headers={"Retry-After": "1"})
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "replica": self.name})
        return await self._stream(request)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(event({"replica": self.name, "chunk": 1}))
            await self.release_stream.wait()
            await response.write(event({"replica": self.name, "chunk": 2}))
            await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise
        return response


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def garbage_server() -> tuple[asyncio.Server, str]:
    """A socket that answers every request with bytes that are not HTTP."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"\x00\x01 not http at all\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"
