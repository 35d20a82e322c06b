"""A fault-injecting OpenAI-compatible server, run on its own thread and event loop so the
load generator's CLI can be driven end to end (it starts its own loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pagedserve.common.encoding import load_encoding

TOKEN = " hello"  # one cl100k_base token, so a text of k tokens counts k


@dataclass
class Served:
    """What the server did with one request."""

    seq: int
    path: str
    payload: dict
    fault: str | None
    prompt_tokens: int
    completion_tokens: int = 0  # tokens streamed before the end or the fault
    completed: bool = False  # a whole, valid stream was sent


class FakeOpenAIServer:
    """Streams ``max_tokens`` (× n) copies of TOKEN.

    ``faults`` maps arrival order to a fault: ``http500`` (an OpenAI-shaped 500), ``drop``
    (the connection aborted after one token), ``malformed`` (invalid JSON in an event),
    ``error_event`` (an ``{"error": ...}`` event) or ``no_done`` (no ``[DONE]`` at the end).
    """

    def __init__(self, faults: dict[int, str] | None = None, send_usage: bool = True,
                 token_delay: float = 0.0, token_text: str = TOKEN) -> None:
        self.token_text = token_text  # "" for tokens the tokenizer has no text for
        self.faults = faults or {}
        self.send_usage = send_usage
        self.token_delay = token_delay
        self.served: list[Served] = []
        self.tokenize_calls = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._encoding = load_encoding("cl100k_base")

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        return app

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    async def _tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        payload = await request.json()
        tokens = [1, *self._encoding.encode_ordinary(payload["prompt"])]  # a BOS, as HF adds
        return web.json_response({"count": len(tokens), "tokens": tokens, "max_model_len": 4096})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=True)

    async def _stream(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(request, chat)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, chat: bool) -> web.StreamResponse:
        payload = await request.json()
        prompt = payload["messages"][0]["content"] if chat else payload["prompt"]
        record = Served(len(self.served), request.path, payload,
                        self.faults.get(len(self.served)), self.count(prompt))
        self.served.append(record)
        if record.fault == "http500":
            return web.json_response({"error": {"message": "injected failure",
                                                "type": "server_error"}}, status=500)
        if not payload.get("stream"):
            return self._whole(record, payload, chat)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if chat:
            await _send(response, {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        for step in range(payload["max_tokens"]):
            if await self._inject(record, response, request, step):
                return response
            for index in range(payload.get("n", 1)):
                text = self.token_text
                piece = {"delta": {"content": text}} if chat else {"text": text}
                await _send(response, {"choices": [{"index": index, **piece}]})
                record.completion_tokens += 1
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        if self.send_usage:
            usage = {"prompt_tokens": record.prompt_tokens,
                     "completion_tokens": record.completion_tokens,
                     "total_tokens": record.prompt_tokens + record.completion_tokens}
            await _send(response, {"choices": [], "usage": usage})
        if record.fault != "no_done":
            await response.write(b"data: [DONE]\n\n")
        record.completed = record.fault is None
        await response.write_eof()
        return response

    def _whole(self, record: Served, payload: dict, chat: bool) -> web.Response:
        """An unstreamed answer: n choices of max_tokens tokens each."""
        n, max_tokens = payload.get("n", 1), payload["max_tokens"]
        text = self.token_text * max_tokens
        choices = [{"index": i, "message": {"role": "assistant", "content": text}} if chat
                   else {"index": i, "text": text} for i in range(n)]
        record.completion_tokens = n * max_tokens
        record.completed = True
        usage = {"prompt_tokens": record.prompt_tokens,
                 "completion_tokens": record.completion_tokens}
        return web.json_response({"choices": choices, "usage": usage})

    async def _inject(self, record: Served, response: web.StreamResponse,
                      request: web.Request, step: int) -> bool:
        """Applies a mid-stream fault after one token; True when the stream is over."""
        if step != 1 or record.fault not in ("drop", "malformed", "error_event"):
            return False
        if record.fault == "drop":
            assert request.transport is not None
            request.transport.abort()
            return True
        if record.fault == "malformed":
            await response.write(b'data: {"choices": [{"text": \n\n')
        else:
            await _send(response, {"error": {"message": "injected stream error"}})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return True


async def _send(response: web.StreamResponse, chunk: dict) -> None:
    await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")


class ServerThread:
    """An aiohttp TestServer on a background thread's event loop."""

    def __init__(self, app: web.Application) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = TestServer(app, host="127.0.0.1")
        asyncio.run_coroutine_threadsafe(self._server.start_server(), self._loop).result(10)
        self.url = str(self._server.make_url("")).rstrip("/")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def serve() -> Iterator:
    """``serve(**FakeOpenAIServer kwargs) -> (server, base_url)``; stopped after the test."""
    threads: list[ServerThread] = []

    def start(**kwargs: object) -> tuple[FakeOpenAIServer, str]:
        server = FakeOpenAIServer(**kwargs)
        thread = ServerThread(server.make_app())
        threads.append(thread)
        return server, thread.url

    yield start
    for thread in threads:
        thread.close()
