"""The router's own front, the server's guard: slow clients are cut off, connections are
capped in all and per client, requests per client (the one a trusted proxy names), a body too
large gets 413 before ``100 Continue``, and every refusal is OpenAI-shaped JSON. Replicas get
the client's address, and only a trusted proxy's forwarding chain."""

from __future__ import annotations

import asyncio
import time

import orjson

from pagedserve.common.http.connection_guard import PROBE_CONNECTIONS
from tests.router.fake_replica import FakeReplica

DEADLINE_S = 0.5
MARGIN_S = 5.0
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


async def exchange(port: int, data: bytes, wait: float = MARGIN_S + 5) -> bytes:
    """What the router answers ``data`` with, until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), wait)
    finally:
        writer.close()


def split(raw: bytes) -> tuple[bytes, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, orjson.loads(body)


def error(message: str, code: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def test_slowloris_heads_are_cut_off_at_the_header_deadline(replicas, make_router) -> None:
    router = await make_router([r.url for r in replicas], timeout_header_read=DEADLINE_S,
                               timeout_keep_alive=0.1)
    start = time.monotonic()

    async def trickle() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        for byte in HEAD[:20]:  # a byte at a time, never the blank line
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)
            if reader.at_eof():
                break
        answer = await asyncio.wait_for(reader.read(), MARGIN_S + 5)
        writer.close()
        return answer

    answers = await asyncio.gather(*(trickle() for _ in range(20)))
    assert answers == [b""] * 20  # every one closed, none answered
    assert DEADLINE_S <= time.monotonic() - start < DEADLINE_S + MARGIN_S
    assert not any(r.requests for r in replicas)


async def test_a_body_that_does_not_arrive_gets_408(replicas, make_router) -> None:
    router = await make_router([r.url for r in replicas], timeout_body_read=DEADLINE_S)
    start = time.monotonic()
    head, body = split(await exchange(router.port, HEAD + b"Content-Length: 100\r\n\r\n{"))
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert body == error(f"The request body did not arrive within {DEADLINE_S:g} s.",
                         "request_timeout")
    assert DEADLINE_S <= time.monotonic() - start < DEADLINE_S + MARGIN_S


async def test_a_body_too_large_gets_413_before_100_continue(replicas, make_router) -> None:
    router = await make_router([r.url for r in replicas], max_request_body_bytes=1024)
    head, body = split(await exchange(
        router.port, HEAD + b"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")  # no 100 first
    assert body == error("Request body too large: 50000000 bytes sent, the limit is 1024 "
                         "bytes.", "request_too_large")


async def test_bad_http_is_a_json_400(replicas, make_router) -> None:
    router = await make_router([r.url for r in replicas])
    head, body = split(await exchange(router.port, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"))
    assert head.split(b" ", 2)[1] == b"400"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("The request could not be parsed as HTTP: ")


async def hold(port: int, count: int) -> list[asyncio.StreamWriter]:
    held = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append(writer)
    return held


async def test_connection_caps(replicas, make_router) -> None:
    router = await make_router([r.url for r in replicas], max_connections=3 + PROBE_CONNECTIONS,
                               max_connections_per_client=3)
    held = await hold(router.port, 3)
    try:
        head, body = split(await exchange(router.port, b"GET /v1/models HTTP/1.1\r\n\r\n"))
        assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        assert body == error(
            "Too many connections open from 127.0.0.1: the limit per client is 3 "
            "(--max-connections-per-client); retry once one of them has finished.",
            "client_limit_exceeded", "rate_limit_error")
    finally:
        for writer in held:
            writer.close()


async def test_requests_per_client_behind_a_trusted_proxy(replicas: list[FakeReplica],
                                                          make_router, http) -> None:
    a = replicas[0]
    a.hang = True
    router = await make_router([a.url], max_requests_per_client=1,
                               forwarded_allow_ips=["127.0.0.1"])

    async def post(client: str) -> tuple[int, dict]:
        async with http.post(router.url + "/v1/completions", json={"prompt": "hi"},
                             headers={"X-Forwarded-For": client}) as response:
            return response.status, await response.json()

    first = asyncio.create_task(post("10.0.0.1"))
    while not a.requests:
        await asyncio.sleep(0.01)
    assert await post("10.0.0.1") == (429, error(
        "Too many requests in flight from 10.0.0.1: the limit per client is 1 "
        "(--max-requests-per-client); retry once one of them has finished.",
        "client_limit_exceeded", "rate_limit_error"))
    second = asyncio.create_task(post("10.0.0.2"))  # another client behind the same proxy
    while len(a.requests) < 2:
        await asyncio.sleep(0.01)
    a.release_stream.set()
    assert [(await task)[0] for task in (first, second)] == [200, 200]
    # The replica sees each client, then the router's peer, in X-Forwarded-For.
    assert [h["X-Forwarded-For"] for h in a.headers] == ["10.0.0.1, 127.0.0.1",
                                                          "10.0.0.2, 127.0.0.1"]


async def test_an_untrusted_forwarding_chain_is_dropped(replicas, make_router, http) -> None:
    router = await make_router([replicas[0].url])
    async with http.post(router.url + "/v1/completions", json={"prompt": "hi"},
                         headers={"X-Forwarded-For": "6.6.6.6",
                                  "Forwarded": "for=6.6.6.6"}) as response:
        assert response.status == 200
    (sent,) = replicas[0].headers
    assert (sent["X-Forwarded-For"], "Forwarded" in sent) == ("127.0.0.1", False)
