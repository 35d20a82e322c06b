"""The router's own refusals: OpenAI-shaped bodies, a Retry-After where waiting helps."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pagedserve.cli.main import SUBCOMMANDS
from pagedserve.router import RouterConfig
from pagedserve.router.cli import add_arguments, config_from_args

ROOT = Path(__file__).resolve().parents[2]


def free_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def error(code: str, message: str, type_: str = "service_unavailable_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


async def test_no_healthy_replica_is_a_503_with_retry_after(make_router, http) -> None:
    router = await make_router([free_port_url()])  # its startup health check ejects it
    for path in ("/v1/completions", "/health"):
        method = http.post if path.startswith("/v1") else http.get
        async with method(router.url + path, json={"prompt": "hi"}) as response:
            assert (response.status, response.headers["Retry-After"]) == (503, "1")
            assert await response.json() == error(
                "no_healthy_replica", "No healthy replica is available.")


async def test_every_attempt_failing_is_a_502(make_router, http) -> None:
    urls = [free_port_url(), free_port_url()]
    router = await make_router(urls)
    for replica in router.state.replicas.replicas.values():
        router.state.replicas.admit(replica)  # as if they had died since the last check
    async with http.post(router.url + "/v1/completions", json={"prompt": "hi"}) as response:
        assert (response.status, response.headers["Retry-After"]) == (502, "1")
        body = await response.json()
    assert body["error"]["code"] == "upstream_failed"
    assert body["error"]["message"].startswith("Every replica tried (2) failed: ")
    assert not any(r.healthy for r in router.state.replicas.replicas.values())


@pytest.mark.parametrize(("data", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b"x" * 2048, 413, "request_too_large"),
])
async def test_bad_bodies_are_refused_before_routing(replicas, make_router, http, data,
                                                     status, code) -> None:
    router = await make_router([r.url for r in replicas], max_request_body_bytes=1024)
    async with http.post(router.url + "/v1/chat/completions", data=data,
                         headers={"Content-Type": "application/json"}) as response:
        assert response.status == status
        body = await response.json()
    assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", code)
    assert not any(r.requests for r in replicas)


async def test_unknown_routes_and_methods(replicas, make_router, http) -> None:
    router = await make_router([r.url for r in replicas])
    async with http.get(router.url + "/v2/nothing") as response:
        assert (response.status, await response.json()) == (404, error(
            "unknown_url", "Invalid URL (GET /v2/nothing)", "invalid_request_error"))
    async with http.get(router.url + "/v1/completions") as response:
        assert response.status == 405
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_in_flight_bound(replicas, make_router, http) -> None:
    router = await make_router([r.url for r in replicas], max_in_flight=1)
    router.state.in_flight = 1  # one request already held
    async with http.post(router.url + "/v1/completions", json={"prompt": "hi"}) as response:
        assert (response.status, response.headers["Retry-After"]) == (503, "1")
        assert (await response.json())["error"]["code"] == "router_overloaded"


def parse(argv: list[str]) -> RouterConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDSERVE_API_KEY", raising=False)
    assert SUBCOMMANDS["router"][0] == "pagedserve.router.cli"
    config = parse(["--replica", "http://a:8000/", "--replica", "http://b:8000",
                    "--policy", "least-load"])
    assert (config.replicas, config.policy) == (["http://a:8000", "http://b:8000"],
                                                "least-load")
    with pytest.raises(ValueError, match="at least one --replica"):
        parse([])
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse(["--replica-dns", "replicas.default.svc"])
    with pytest.raises(ValueError, match=r"load_factor must be at least 1\.0"):
        parse(["--replica", "http://a", "--load-factor", "0.5"])
    assert parse(["--replica", "http://a"]).prefix_load_factor == 1.0
    assert parse(["--replica", "http://a", "--prefix-load-factor", "1.5"]).prefix_load_factor == 1.5
    with pytest.raises(ValueError, match=r"prefix_load_factor must be at least 1\.0"):
        parse(["--replica", "http://a", "--prefix-load-factor", "0.9"])
    front = parse(["--replica", "http://a", "--stream-idle-timeout", "12",
                   "--failures-to-eject", "3", "--health-port", "8081",
                   "--max-connections", "10", "--max-connections-per-client", "4",
                   "--max-requests-per-client", "2", "--forwarded-allow-ips", "10.0.0.0/8, ::1",
                   "--timeout-header-read", "3", "--timeout-body-read", "4",
                   "--timeout-keep-alive", "6", "--replica-api-key", "k"])
    assert (front.stream_idle_timeout, front.failures_to_eject, front.health_port) == (
        12.0, 3, 8081)
    assert (front.max_connections, front.max_connections_per_client,
            front.max_requests_per_client) == (10, 4, 2)
    assert (front.forwarded_allow_ips, front.replica_api_key) == (["10.0.0.0/8", "::1"], "k")
    assert (front.timeout_header_read, front.timeout_body_read, front.timeout_keep_alive) == (
        3.0, 4.0, 6.0)
    defaults = parse(["--replica", "http://a"])
    assert (defaults.stream_idle_timeout, defaults.failures_to_eject, defaults.replica_api_key,
            defaults.forwarded_allow_ips) == (30.0, 2, None, [])
    monkeypatch.setenv("PAGEDSERVE_API_KEY", "from-env,other")  # compose's and the replicas'
    assert parse(["--replica", "http://a"]).replica_api_key == "from-env"
    with pytest.raises(ValueError, match="not an IP address"):
        parse(["--replica", "http://a", "--forwarded-allow-ips", "router"])
    with pytest.raises(ValueError, match="stream_idle_timeout must be positive, got 0"):
        parse(["--replica", "http://a", "--stream-idle-timeout", "0"])


def test_the_router_imports_no_torch() -> None:
    code = ("import sys, pagedserve.router.cli, pagedserve.router.app; "
            "sys.exit('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
