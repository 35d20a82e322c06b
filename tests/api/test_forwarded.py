"""``--forwarded-allow-ips``: behind a trusted proxy the per-client limits and the tenant key
follow the client its forwarding header names; from any other peer the header changes
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from pagedserve.common.http.forwarded import TrustedProxies, parse_allow_ips
from pagedserve.server.api.http.admission import ADMISSION_KEY
from pagedserve.server.api.http.limits import ServerConfigError, ServerLimits
from pagedserve.server.engine.core.request_preparation import EngineRequest
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config
from tests.api.test_client_limits import request_from, wait_for
from tests.api.test_limits import error, hold_connections, release, split

PROXY = "127.0.0.8"
OTHER_PEER = "127.0.0.9"


def request(peer: str, headers: dict[str, str]) -> Any:
    return make_mocked_request("GET", "/v1/models", headers=headers).clone(remote=peer)


@pytest.mark.parametrize(("peer", "header", "client"), [
    # A trusted proxy: the right-most entry that is not a trusted proxy's is the client.
    ("10.0.0.1", "6.6.6.6, 1.2.3.4", "1.2.3.4"),
    ("10.0.0.1", "6.6.6.6, 1.2.3.4, 10.0.0.7", "1.2.3.4"),  # two proxies of 10/8 in a row
    ("10.0.0.1", "1.2.3.4:5678", "1.2.3.4"),
    ("10.0.0.1", "[2001:db8::1]:80", "2001:db8::1"),
    ("10.0.0.1", "10.0.0.2, 10.0.0.3", "10.0.0.2"),  # all trusted: the left-most
    ("10.0.0.1", "", "10.0.0.1"),
    ("::ffff:10.0.0.1", "1.2.3.4", "1.2.3.4"),  # a dual-stack socket's mapped address
    # Any other peer: the header is not read.
    ("1.2.3.4", "9.9.9.9", "1.2.3.4"),
    ("192.168.0.1", "10.0.0.1, 9.9.9.9", "192.168.0.1"),
])
def test_the_client_behind_trusted_proxies(peer: str, header: str, client: str) -> None:
    proxies = TrustedProxies(parse_allow_ips("10.0.0.0/8, 127.0.0.1"))
    headers = {"X-Forwarded-For": header} if header else {}
    assert proxies.client_address(request(peer, headers)) == client


def test_only_the_named_header_is_read() -> None:
    forged = {"Forwarded": 'for="6.6.6.6"', "X-Forwarded-For": "1.2.3.4"}
    assert TrustedProxies(["10.0.0.1"]).client_address(request("10.0.0.1", forged)) == "1.2.3.4"
    rfc = TrustedProxies(["10.0.0.0/8"], "forwarded")
    assert rfc.client_address(request("10.0.0.1", forged)) == "6.6.6.6"
    chain = {"Forwarded": 'for=6.6.6.6, for="[2001:db8::2]:4711";proto=https, for=10.0.0.5'}
    assert rfc.client_address(request("10.0.0.1", chain)) == "2001:db8::2"


def test_nothing_is_trusted_unless_named() -> None:
    headers = {"X-Forwarded-For": "1.2.3.4"}
    assert TrustedProxies().client_address(request("127.0.0.1", headers)) == "127.0.0.1"
    assert TrustedProxies(["*"]).client_address(request("8.8.8.8", headers)) == "1.2.3.4"


def test_a_bad_entry_is_a_config_error(model_dir: Path) -> None:
    with pytest.raises(ServerConfigError, match=r"forwarded_allow_ips: '10\.0\.0\.300' is not "
                                                r"an IP address, a network \(CIDR\) or '\*'"):
        server_config(str(model_dir), forwarded_allow_ips=["10.0.0.300"])


@pytest.fixture(scope="module")
def proxied_server(model_dir: Path) -> Iterator[LiveServer]:
    limits = ServerLimits(max_connections=20, max_connections_per_client=2,
                          max_requests_per_client=1)
    live = LiveServer(server_config(str(model_dir), limits=limits,
                                    forwarded_allow_ips=[PROXY])).start()
    yield live
    live.stop()


def forwarded_for(client: str) -> bytes:
    return f"X-Forwarded-For: 6.6.6.6, {client}\r\n".encode()


def models(headers: bytes = b"") -> bytes:
    return b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"


async def test_a_proxied_client_has_its_own_share(proxied_server: LiveServer) -> None:
    gate = proxied_server.app[ADMISSION_KEY]
    port = proxied_server.port
    held = await hold_connections(port, 1, host=PROXY, headers=forwarded_for("9.9.9.9"))
    await wait_for(lambda: gate.per_address.held("9.9.9.9") == 1)
    head, body = split(await request_from(port, PROXY, models(forwarded_for("9.9.9.9"))))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert body == error(
        "Too many requests in flight from 9.9.9.9: the limit per client is 1 "
        "(--max-requests-per-client); retry once one of them has finished.",
        code="client_limit_exceeded", kind="rate_limit_error")
    # Another client behind the same proxy, and the proxy itself, go on.
    for headers in (forwarded_for("9.9.9.10"), b""):
        raw = await request_from(port, PROXY, models(headers))
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    await release(proxied_server.site.guard, held)
    await wait_for(lambda: len(gate.per_address) == 0)


async def test_a_forged_header_from_an_untrusted_peer_changes_nothing(
        proxied_server: LiveServer) -> None:
    gate = proxied_server.app[ADMISSION_KEY]
    port = proxied_server.port
    held = await hold_connections(port, 1, host=OTHER_PEER, headers=forwarded_for("9.9.9.9"))
    await wait_for(lambda: gate.per_address.held(OTHER_PEER) == 1)
    assert gate.per_address.held("9.9.9.9") == 0
    # Naming another client in the header does not get it out of its own share...
    head, body = split(await request_from(port, OTHER_PEER, models(forwarded_for("9.9.9.11"))))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert body["error"]["message"].startswith(f"Too many requests in flight from {OTHER_PEER}:")
    # ...nor, from the proxy, is the client it named held back by the forgery.
    raw = await request_from(port, PROXY, models(forwarded_for("9.9.9.9")))
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    await release(proxied_server.site.guard, held)
    await wait_for(lambda: len(gate.per_address) == 0)


async def test_a_trusted_proxys_connections_are_not_one_clients(
        proxied_server: LiveServer) -> None:
    guard = proxied_server.site.guard
    held = []  # idle: open, nothing sent yet
    for host in (PROXY, PROXY, PROXY, OTHER_PEER, OTHER_PEER):
        _, writer = await asyncio.open_connection("127.0.0.1", proxied_server.port,
                                                  local_addr=(host, 0))
        held.append(writer)
    await wait_for(lambda: guard.num_open == 5)
    assert (guard.per_client.held(PROXY), guard.per_client.held(OTHER_PEER)) == (0, 2)
    head, _ = split(await request_from(proxied_server.port, OTHER_PEER, models()))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    await release(guard, held)


async def test_the_tenant_is_the_proxied_client(
        proxied_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = proxied_server.engine
    generate = engine.generate
    tenants: list[str | None] = []

    async def recording(requests: list[EngineRequest]) -> Any:
        tenants.extend(request.tenant for request in requests)
        return await generate(requests)

    monkeypatch.setattr(engine, "generate", recording)
    body = b'{"model": "%s", "prompt": "a", "max_tokens": 1}' % MODEL.encode()
    for peer in (PROXY, OTHER_PEER):
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
                + forwarded_for("9.9.9.12") + b"\r\n" + body)
        raw = await asyncio.wait_for(request_from(proxied_server.port, peer, head), 30)
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert tenants == ["addr:9.9.9.12", f"addr:{OTHER_PEER}"]
