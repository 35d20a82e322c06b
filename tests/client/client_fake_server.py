"""A small OpenAI-compatible server for the client tests, with scripted faults.

Each request is keyed by its prompt (completions) or its last message's content (chat). A
script maps a key to the faults of its successive attempts; once the script runs out the
request succeeds. The server records every arrival and answer with loop timestamps and the
tokens in flight (prompt + n × max_tokens, the client's own reservation formula), so tests
assert on what the server saw rather than on the test's wall clock.

Fault forms, one per attempt:
    ("status", code[, headers[, error_code]])
                                   OpenAI-shaped error body "injected <code>" whose error
                                   code is error_code (default: the status as text)
    ("slow", seconds)              sleep before answering normally
    ("after", n)                   answer only once n other answers have gone out
    ("drop",)                      headers and half a body, then close the connection
    ("stream_drop", k)             a stream that closes the connection after k chunks
    ("bad_sse", k)                 a stream whose chunk k is not JSON
    ("stall", k, seconds)          a stream that pauses before chunk k
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from pagedserve.common.encoding import load_encoding
from pagedserve.common.load_hints import LoadHints

Fault = tuple[Any, ...]


@dataclass
class Arrival:
    key: str
    path: str
    body: dict[str, Any]
    reserved: int
    at: float


@dataclass
class Answer:
    key: str
    status: int
    at: float
    dropped: bool = False  # the connection was cut before the body was complete


@dataclass
class StreamRecord:
    chunks_written: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)


def _key(body: dict[str, Any]) -> str:
    if "messages" in body:
        return str(body["messages"][-1].get("content"))
    return str(body.get("prompt"))


class FakeOpenAIServer:
    def __init__(
        self,
        *,
        delay: float = 0.0,
        script: dict[str, list[Fault]] | None = None,
        hints: Callable[[FakeOpenAIServer], LoadHints | None] | None = None,
        load: dict[str, Any] | None = None,
        stream_chunks: int = 4,
        chunk_interval: float = 0.0,
        max_model_len: int = 2048,
    ) -> None:
        self.delay = delay
        self.script: dict[str, deque[Fault]] = {k: deque(v) for k, v in (script or {}).items()}
        self.hints = hints
        self.load = load
        self.stream_chunks = stream_chunks
        self.chunk_interval = chunk_interval
        self.max_model_len = max_model_len
        self.encoding = load_encoding("cl100k_base")
        self.arrivals: list[Arrival] = []
        self.answers: list[Answer] = []
        self.streams: dict[str, StreamRecord] = defaultdict(StreamRecord)
        self.tokenize_bodies: list[dict[str, Any]] = []
        self.auth_headers: list[str | None] = []
        self.in_flight_tokens = 0
        self.max_in_flight_tokens = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.load_calls = 0
        self._server: TestServer | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        if self.load is not None:
            app.router.add_get("/load", self._load)
        return app

    async def start(self) -> str:
        self._server = TestServer(self.app())
        await self._server.start_server()
        return str(self._server.make_url("/")).rstrip("/")

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()

    def arrivals_for(self, key: str) -> list[Arrival]:
        return [a for a in self.arrivals if a.key == key]

    def answers_for(self, key: str) -> list[Answer]:
        return [a for a in self.answers if a.key == key]

    def count(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def _reserved(self, body: dict[str, Any]) -> int:
        prompt = self._prompt_tokens(body)
        return prompt + int(body.get("n", 1)) * int(body.get("max_tokens", 16))

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        if "messages" in body:
            return sum(self.count(str(m.get("content", ""))) for m in body["messages"])
        return self.count(str(body.get("prompt", "")))

    def _headers(self) -> dict[str, str]:
        hints = self.hints(self) if self.hints else None
        return hints.to_headers() if hints else {}

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        key, reserved = _key(body), self._reserved(body)
        self.auth_headers.append(request.headers.get("Authorization"))
        self.arrivals.append(Arrival(key, request.path, body, reserved, self._now()))
        self.in_flight_tokens += reserved
        self.in_flight += 1
        self.max_in_flight_tokens = max(self.max_in_flight_tokens, self.in_flight_tokens)
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        fault = self.script[key].popleft() if self.script.get(key) else ("ok",)
        try:
            response = await self._respond(request, body, key, fault)
        finally:
            self.in_flight_tokens -= reserved
            self.in_flight -= 1
        dropped = fault[0] in ("drop", "stream_drop")
        self.answers.append(Answer(key, response.status, self._now(), dropped))
        return response

    async def _respond(
        self, request: web.Request, body: dict[str, Any], key: str, fault: Fault
    ) -> web.StreamResponse:
        kind = fault[0]
        if kind == "status":
            headers = dict(fault[2]) if len(fault) > 2 else {}
            return self._error(fault[1], headers, *fault[3:4])
        if kind == "slow":
            await asyncio.sleep(fault[1])
        elif kind == "after":
            while len(self.answers) < fault[1]:
                await asyncio.sleep(0.005)
        elif self.delay:
            await asyncio.sleep(self.delay)
        if kind == "drop":
            return await self._drop(request)
        if body.get("stream"):
            return await self._stream(request, body, key, fault)
        return web.Response(
            body=orjson.dumps(self._completion(body)),
            content_type="application/json",
            headers={**self._headers(), "x-request-id": f"req-{len(self.answers)}"},
        )

    def _error(self, status: int, headers: dict[str, str], code: str | None = None) -> web.Response:
        error = {"message": f"injected {status}", "type": "injected_error",
                 "code": code or str(status)}
        return web.Response(
            status=status,
            body=orjson.dumps({"error": error}),
            content_type="application/json",
            headers={**self._headers(), **headers},
        )

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b'{"id": "cmpl-dropped", "choi')
        assert request.transport is not None
        request.transport.close()
        return response

    def _texts(self, body: dict[str, Any]) -> list[str]:
        return [f" tok{i}" for i in range(int(body.get("max_tokens", 16)))]

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        texts, n = self._texts(body), int(body.get("n", 1))
        prompt_tokens = self._prompt_tokens(body)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n * len(texts),
            "total_tokens": prompt_tokens + n * len(texts),
        }
        chat = "messages" in body
        choices = []
        for index in range(n):
            choice: dict[str, Any] = {"index": index, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "".join(texts)}
                choice["logprobs"] = self._chat_logprobs(texts) if body.get("logprobs") else None
            else:
                choice["text"] = "".join(texts)
                choice["logprobs"] = self._logprobs(texts) if body.get("logprobs") else None
            choices.append(choice)
        return {
            "id": "chatcmpl-1" if chat else "cmpl-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1700000000,
            "model": body.get("model", "fake"),
            "choices": choices,
            "usage": usage,
        }

    def _logprobs(self, texts: list[str]) -> dict[str, Any]:
        offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
        return {
            "tokens": texts,
            "token_logprobs": [-0.5] * len(texts),
            "top_logprobs": [{t: -0.5} for t in texts],
            "text_offset": offsets,
        }

    def _chat_logprobs(self, texts: list[str]) -> dict[str, Any]:
        return {
            "content": [
                {"token": t, "logprob": -0.5, "bytes": list(t.encode()),
                 "top_logprobs": [{"token": t, "logprob": -0.5, "bytes": None}]}
                for t in texts
            ]
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], key: str, fault: Fault
    ) -> web.StreamResponse:
        record = self.streams[key]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **self._headers()}
        )
        await response.prepare(request)
        chat = "messages" in body
        try:
            for index in range(self.stream_chunks):
                if fault[0] == "stream_drop" and index == fault[1]:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if fault[0] == "stall" and index == fault[1]:
                    await asyncio.sleep(fault[2])
                if fault[0] == "bad_sse" and index == fault[1]:
                    await response.write(b"data: {not json\n\n")
                else:
                    await response.write(_sse(_chunk(chat, index, f" tok{index}", None)))
                record.chunks_written += 1
                await asyncio.sleep(self.chunk_interval)
            await response.write(_sse(_chunk(chat, self.stream_chunks, "", "length")))
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            record.disconnected.set()
            raise
        return response

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenize_bodies.append(body)
        if "messages" in body:
            text = "".join(str(m.get("content", "")) for m in body["messages"])
            tokens = self.encoding.encode_ordinary(text) + [0] * 7  # its own chat template
        else:
            tokens = self.encoding.encode_ordinary(body["prompt"])
        payload = {"count": len(tokens), "tokens": tokens, "max_model_len": self.max_model_len}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
        payload = {"object": "list", "data": [model]}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != "fake-model":
            return self._error(404, {}, "model_not_found")
        payload = {"id": name, "object": "model", "created": 0, "owned_by": "fake"}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _load(self, request: web.Request) -> web.Response:
        self.load_calls += 1
        return web.Response(body=orjson.dumps(self.load), content_type="application/json")


def _chunk(chat: bool, index: int, text: str, finish: str | None) -> dict[str, Any]:
    if chat:
        delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-s", "model": "fake", "choices": [choice]}
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return {"id": "cmpl-s", "model": "fake", "choices": [choice]}


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
