"""Bounded work per request and per connection: prompt and completion caps, tokenization off
the event loop, idle and header-read timeouts, the connection cap, and 413 for a body
announced too large before it is sent."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pagedserve.common.http import connection_guard as connections
from pagedserve.server.api.http.jsonio import OFF_LOOP_BODY_BYTES
from pagedserve.server.api.http.limits import ServerLimits
from tests.api.conftest import MAX_BODY_BYTES, MODEL
from tests.api.live_server import LiveServer, server_config

# Bounds on how long a test waits for something that must happen; never asserted as times.
WAIT_S = 30
LARGE_BODY_BYTES = 4 * OFF_LOOP_BODY_BYTES


def error(message: str, param: str | None = None, code: str | None = None,
          kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@pytest.fixture(scope="module")
def guarded_server(model_dir: Path) -> Iterator[LiveServer]:
    limits = ServerLimits(timeout_keep_alive=0.5, max_connections=3)
    live = LiveServer(server_config(str(model_dir), limits=limits,
                                    max_request_body_bytes=LARGE_BODY_BYTES)).start()
    yield live
    live.stop()


async def post(server: LiveServer, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(server.base_url + path,
                                                                json=body) as response:
        return response.status, await response.json()


async def test_too_many_prompts(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": ["ab"] * 1025, "max_tokens": 1}
    assert await post(server, "/v1/completions", body) == (400, error(
        "the request has 1025 prompts, more than the limit of 1024 "
        "(--max-prompts-per-request)", "prompt"))


async def test_too_many_completions(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": ["ab"] * 300, "max_tokens": 1, "n": 2, "best_of": 4}
    assert await post(server, "/v1/completions", body) == (400, error(
        "the request asks for 1200 completions (300 prompts × 4 each, n / best_of), more "
        "than the limit of 1024 (--max-completions-per-request)", "n"))


@pytest.mark.parametrize("path", ["/tokenize", "/v1/completions", "/v1/chat/completions"])
async def test_large_inputs_are_tokenized_off_the_event_loop(
        guarded_server: LiveServer, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    server = guarded_server
    tokenizer = server.engine.tokenizer
    encode = tokenizer.encode
    release = threading.Event()
    threads: list[str] = []

    def held_encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.current_thread().name)
        if len(text) > OFF_LOOP_BODY_BYTES // 2:
            release.wait(WAIT_S)  # a slow tokenization, holding its thread until released
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", held_encode)
    text = "word " * (2 * OFF_LOOP_BODY_BYTES // 5)  # goes off the loop, under the limit
    body: dict[str, Any] = {"model": MODEL}
    if path == "/v1/chat/completions":
        body.update(messages=[{"role": "user", "content": text}], max_tokens=1)
    else:
        body.update(prompt=text, **({"max_tokens": 1} if "completions" in path else {}))
    async with aiohttp.ClientSession() as session:
        slow = asyncio.ensure_future(session.post(server.base_url + path, json=body))
        while not threads:
            await asyncio.sleep(0.01)
        # The event loop still answers while the tokenizer thread is busy.
        async with session.get(server.base_url + "/health") as health:
            assert health.status == 200
        assert not slow.done()
        release.set()
        async with await slow as response:
            assert response.status in (200, 400)  # 400: longer than this model's context
    assert threads[0].startswith("pagedserve-tokenizer")


async def test_small_inputs_are_tokenized_inline(server: LiveServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = server.engine.tokenizer
    encode = tokenizer.encode
    threads: list[str] = []

    def recording_encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", recording_encode)
    status, body = await post(server, "/tokenize", {"model": MODEL, "prompt": "hi there"})
    assert (status, body["tokens"]) == (200, encode("hi there"))
    assert not threads[0].startswith("pagedserve-tokenizer")


async def raw_request(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    data = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    return data


async def test_expect_continue_with_an_oversized_body_gets_413_first(server: LiveServer) -> None:
    size = MAX_BODY_BYTES + 1
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nExpect: 100-continue\r\n\r\n").encode()
    # No body is ever sent: the answer must come without it.
    raw = await raw_request(server.port, head)
    status_line, _, rest = raw.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == error(
        f"Request body too large: {size} bytes sent, the limit is {MAX_BODY_BYTES} bytes.",
        code="request_too_large")


async def test_expect_continue_within_the_limit_continues(server: LiveServer) -> None:
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n"
                 f"Connection: close\r\n\r\n".encode())
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    final = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    assert final.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_idle_connections_are_closed(guarded_server: LiveServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded_server.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    # Kept alive, then idle: the server closes it.
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    writer.close()


async def hold_connections(port: int, count: int, host: str = "127.0.0.1",
                           headers: bytes = b"") -> list[asyncio.StreamWriter]:
    """``count`` busy connections (not idle: each has a request whose body is still
    coming), from the source address ``host``."""
    held = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))
        writer.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n" + headers + b"\r\n{")
        held.append(writer)
    return held


async def release(guard: connections.ConnectionGuard, held: list[asyncio.StreamWriter]) -> None:
    for writer in held:
        writer.close()
    while guard.num_open + guard.num_probes > 0:
        await asyncio.sleep(0.01)


def split(raw: bytes) -> tuple[bytes, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, json.loads(body)


async def test_connections_beyond_the_cap_get_503_but_probes(guarded_server: LiveServer) -> None:
    guard = guarded_server.site.guard
    held = await hold_connections(guarded_server.port, 3)
    while guard.num_open < 3:
        await asyncio.sleep(0.01)
    # Past the cap, /health and /metrics are still answered, each on a connection of its own.
    head, body = split(await raw_request(guarded_server.port,
                                         b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nConnection: close" in head
    assert body == {"status": "ok"}
    raw = await raw_request(guarded_server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and b"pagedserve:" in raw
    head, body = split(await raw_request(guarded_server.port,
                                         b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head
    assert body == error(
        "The server has 3 connections open, its limit; retry shortly. Only /health and "
        "/metrics are answered on this connection.",
        code="too_many_connections", kind="service_unavailable_error")
    # Once the connections kept for probes are taken too, a new one is refused outright.
    probes = await hold_connections(guarded_server.port, connections.PROBE_CONNECTIONS)
    while guard.num_probes < connections.PROBE_CONNECTIONS:
        await asyncio.sleep(0.01)
    head, body = split(await raw_request(guarded_server.port,
                                         b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head
    assert body == error("The server has 3 connections open, its limit; retry shortly.",
                         code="too_many_connections", kind="service_unavailable_error")
    await release(guard, held + probes)
    async with aiohttp.ClientSession() as session, session.get(
            guarded_server.base_url + "/v1/models") as response:
        assert response.status == 200


async def test_headers_trickling_in_are_cut_off(model_dir: Path) -> None:
    # The first head gets --timeout-header-read even where --timeout-keep-alive is shorter.
    limits = ServerLimits(timeout_keep_alive=0.2, timeout_header_read=3.0)
    live = await asyncio.to_thread(
        lambda: LiveServer(server_config(str(model_dir), limits=limits)).start())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        await asyncio.sleep(1.0)  # past the keep-alive timeout, within the header deadline
        writer.write(b"Connection: close\r\n\r\n")
        head, _ = split(await asyncio.wait_for(reader.read(), WAIT_S))
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
    finally:
        await asyncio.to_thread(live.stop)


@pytest.mark.parametrize(("limits", "expected", "warned"), [
    ((1024, 4096), 2048 + 128, False),  # raised to what the cap needs
    ((1024, 1500), 1500, True),  # only up to the hard limit: a warning says so
    ((65536, 65536), 65536, False),  # already enough: untouched
])
def test_the_open_file_limit_is_raised_for_the_connection_cap(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        limits: tuple[int, int], expected: int, warned: bool) -> None:
    current = list(limits)
    monkeypatch.setattr(connections.resource, "getrlimit", lambda _: tuple(current))
    monkeypatch.setattr(connections.resource, "setrlimit",
                        lambda _, value: current.__setitem__(slice(None), value))
    assert connections.ensure_descriptors(2048) == expected
    assert current == [expected, limits[1]]
    assert ("below --max-connections (2048)" in caplog.text) == warned
