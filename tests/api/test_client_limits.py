"""Each client's share: connections and requests in flight per source address and per API
key (429 with Retry-After past it, while other clients go on), and the health port."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pagedserve.common.http.client_limits import ClientCounter
from pagedserve.server.api.http.admission import ADMISSION_KEY
from pagedserve.server.api.http.limits import ServerLimits
from pagedserve.server.engine.core.request_preparation import EngineRequest
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config
from tests.api.test_limits import error, hold_connections, raw_request, release, split

KEYS = ["key-a", "key-b"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def shared_server(model_dir: Path) -> Iterator[LiveServer]:
    limits = ServerLimits(max_connections=20, max_connections_per_client=3,
                          max_requests_per_client=2, max_tokens_per_request=MAX_TOKENS)
    live = LiveServer(server_config(str(model_dir), limits=limits, api_key=KEYS,
                                    health_port=0)).start()
    yield live
    live.stop()


def bearer(key: str) -> bytes:
    return f"Authorization: Bearer {key}\r\n".encode()


def get(path: str, key: str = KEYS[0]) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + bearer(key)
            + b"\r\n")


async def request_from(port: int, host: str, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))
    writer.write(head)
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return data


async def wait_for(predicate: object) -> None:
    while not predicate():  # type: ignore[operator]
        await asyncio.sleep(0.01)


def test_the_counter_forgets_clients_that_hold_nothing() -> None:
    counter = ClientCounter(2)
    assert [counter.try_acquire("a") for _ in range(3)] == [True, True, False]
    assert counter.try_acquire("b")
    counter.release("a")
    assert counter.try_acquire("a") and counter.held("a") == 2
    for client in ("a", "a", "b"):
        counter.release(client)
    assert len(counter) == 0


async def test_connections_past_a_clients_share_get_429(shared_server: LiveServer) -> None:
    guard = shared_server.site.guard
    held = await hold_connections(shared_server.port, 3, host="127.0.0.2")
    await wait_for(lambda: guard.per_client.held("127.0.0.2") == 3)
    head, body = split(await request_from(shared_server.port, "127.0.0.2", get("/v1/models")))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head
    assert body == error(
        "Too many connections open from 127.0.0.2: the limit per client is 3 "
        "(--max-connections-per-client); retry once one of them has finished.",
        code="client_limit_exceeded", kind="rate_limit_error")
    # Another address is not held back by it.
    raw = await request_from(shared_server.port, "127.0.0.3", get("/v1/models"))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    await release(guard, held)
    raw = await request_from(shared_server.port, "127.0.0.2", get("/v1/models"))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_requests_in_flight_past_an_addresses_share_get_429(
        shared_server: LiveServer) -> None:
    held = await hold_connections(shared_server.port, 2, host="127.0.0.4",
                                  headers=bearer(KEYS[1]))
    gate = shared_server.app[ADMISSION_KEY]
    await wait_for(lambda: gate.per_address.held("127.0.0.4") == 2)
    head, body = split(await request_from(shared_server.port, "127.0.0.4",
                                          get("/v1/models", KEYS[0])))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head
    assert body == error(
        "Too many requests in flight from 127.0.0.4: the limit per client is 2 "
        "(--max-requests-per-client); retry once one of them has finished.",
        code="client_limit_exceeded", kind="rate_limit_error")
    await release(shared_server.site.guard, held)
    await wait_for(lambda: gate.per_address.held("127.0.0.4") == 0)
    raw = await request_from(shared_server.port, "127.0.0.4", get("/v1/models"))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_requests_in_flight_past_a_keys_share_get_429(shared_server: LiveServer) -> None:
    # Two addresses, one key: the key's share is what runs out.
    held = [*await hold_connections(shared_server.port, 1, host="127.0.0.5",
                                    headers=bearer(KEYS[0])),
            *await hold_connections(shared_server.port, 1, host="127.0.0.6",
                                    headers=bearer(KEYS[0]))]
    gate = shared_server.app[ADMISSION_KEY]
    await wait_for(lambda: gate.per_key.held("0") == 2)
    head, body = split(await request_from(shared_server.port, "127.0.0.7",
                                          get("/v1/models", KEYS[0])))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert body == error(
        "Too many requests in flight with this API key: the limit per client is 2 "
        "(--max-requests-per-client); retry once one of them has finished.",
        code="client_limit_exceeded", kind="rate_limit_error")
    # The other key, from the same address, goes on; the refused request held nothing.
    raw = await request_from(shared_server.port, "127.0.0.7", get("/v1/models", KEYS[1]))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert gate.per_address.held("127.0.0.7") == 0
    await release(shared_server.site.guard, held)
    await wait_for(lambda: gate.per_key.held("0") == 0)


async def keep_alive_request(port: int, host: str, key: str) -> asyncio.StreamWriter:
    """A connection from ``host`` that has had one answered request with ``key`` and stays
    open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + bearer(key) + b"\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return writer


async def test_connections_past_a_keys_share_get_429(shared_server: LiveServer) -> None:
    # Three addresses, one key: the key's share of connections is what runs out.
    port = shared_server.port
    held = [await keep_alive_request(port, f"127.0.2.{i}", KEYS[0]) for i in (1, 2, 3)]
    counted = shared_server.app[ADMISSION_KEY].key_connections.per_key
    assert counted.held("0") == 3
    head, body = split(await request_from(port, "127.0.2.4", get("/v1/models", KEYS[0])))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head and b"\r\nConnection: close\r\n" in head
    assert body == error(
        "Too many connections open with this API key: the limit per client is 3 "
        "(--max-connections-per-client); retry once one of them has finished.",
        code="client_limit_exceeded", kind="rate_limit_error")
    # The other key, from the same address, goes on; a request on a counted connection too.
    raw = await request_from(port, "127.0.2.4", get("/v1/models", KEYS[1]))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    held[0].write(get("/v1/models", KEYS[0]))
    await wait_for(lambda: counted.held("0") == 2)  # answered, then closed: freed
    raw = await request_from(port, "127.0.2.4", get("/v1/models", KEYS[0]))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    await release(shared_server.site.guard, held)
    assert len(counted) == 0


async def test_the_health_port_serves_probes_only(shared_server: LiveServer) -> None:
    port = shared_server.health_port
    assert port is not None and port != shared_server.port
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/health") as response:
            assert (response.status, await response.json()) == (200, {"status": "ok"})
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            assert "pagedserve:" in await response.text()
    head, body = split(await raw_request(port, get("/v1/models")))
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert body == error("Only /health and /metrics are served on the health port.",
                         code="unknown_url")


async def test_the_health_port_answers_while_the_main_port_is_full(
        shared_server: LiveServer) -> None:
    guard = shared_server.site.guard
    # Every connection of the main port (and those kept for probes) taken, from many
    # addresses so that no client's share stops them first.
    hosts = [f"127.0.1.{i}" for i in range(1, 20)]
    held = [w for host in hosts for w in await hold_connections(shared_server.port, 3, host)]
    await wait_for(lambda: guard.num_open == 20 and guard.num_probes == guard.probe_connections)
    head, _ = split(await raw_request(shared_server.port, get("/health")))
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    head, body = split(await raw_request(shared_server.health_port, get("/health")))
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == {"status": "ok"}
    await release(guard, held)


async def post(server: LiveServer, path: str, body: Any, key: str = KEYS[0]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + path, json=body,
            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, await response.json()


async def test_a_requests_prompt_tokens_are_bounded(shared_server: LiveServer) -> None:
    tokenizer = shared_server.engine.tokenizer
    prompts = ["hello world " * 4] * 3
    num_tokens = sum(len(tokenizer.encode(p)) for p in prompts)
    assert num_tokens > MAX_TOKENS >= len(tokenizer.encode(prompts[0]))

    def too_many(count: int, param: str) -> dict[str, Any]:
        return error(f"the request's prompts have {count} tokens in all, more than the limit "
                     f"of {MAX_TOKENS} (--max-tokens-per-request)", param)

    assert await post(shared_server, "/v1/completions", {
        "model": MODEL, "prompt": prompts, "max_tokens": 1}) == (
        400, too_many(num_tokens, "prompt"))
    assert (await post(shared_server, "/v1/completions", {
        "model": MODEL, "prompt": prompts[:1], "max_tokens": 1}))[0] == 200
    text = " ".join(prompts)
    status, body = await post(shared_server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1})
    assert status == 400 and body["error"]["param"] == "messages"
    chat_tokens = await post(shared_server, "/tokenize", {
        "model": MODEL, "messages": [{"role": "user", "content": text}]})
    assert body == too_many(chat_tokens[1]["count"], "messages")
    status, body = await post(shared_server, "/v1/responses", {
        "model": MODEL, "input": text, "max_output_tokens": 1})
    assert (status, body) == (400, too_many(chat_tokens[1]["count"], "input"))


async def test_each_key_is_its_own_tenant_in_the_engine(
        shared_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = shared_server.engine
    generate = engine.generate
    tenants: list[str | None] = []

    async def recording(requests: list[EngineRequest]) -> Any:
        tenants.extend(request.tenant for request in requests)
        return await generate(requests)

    monkeypatch.setattr(engine, "generate", recording)
    for key in (KEYS[1], KEYS[0]):
        assert (await post(shared_server, "/v1/completions", {
            "model": MODEL, "prompt": ["a", "b"], "max_tokens": 1}, key))[0] == 200
    assert tenants == ["key:1", "key:1", "key:0", "key:0"]
