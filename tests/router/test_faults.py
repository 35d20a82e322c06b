"""Faults injected into fake replicas, and what the router's client gets, within what time.

Each case puts a faulty replica first (round-robin over ``[faulty, good]``, so the first
request goes to it) and streams one completion. Before the first byte the request must land
on the good replica; after it the client must get an error event and ``data: [DONE]``. The
waits are bounded by the configured timeouts plus a margin for a loaded machine; none is a
claim about speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from pagedserve.router.proxy import REPLICA_HEADER
from tests.router.conftest import Router
from tests.router.fake_replica import FakeReplica
from tests.router.raw_replica import (
    RawReplica,
    empty_stream,
    reset,
    reset_after_first_event,
    truncated,
)
from tests.router.test_routing import metric, prompts_homed_on

IDLE_S = 0.5  # the stream idle timeout where a case relies on it
LONG_S = 30.0  # where a case must not wait for it
HEALTH_S = 0.2  # health interval and timeout where health checks run
MARGIN_S = 5.0
GOOD_STREAM = [{"replica": "b", "chunk": 1}, {"replica": "b", "chunk": 2}, "[DONE]"]


async def stream(http: aiohttp.ClientSession, router: Router, path: str = "/v1/completions",
                 after_first_event: Callable[[], None] | None = None, prompt: str = "hi",
                 ) -> tuple[str, list[Any], float]:
    """One streamed request: the replica that answered, its events (JSON, or the raw text of
    ``[DONE]`` and of typed events' ``event:`` lines), and the seconds it took (from its
    first event when ``after_first_event`` is given, which is called then)."""
    start = time.monotonic()
    body = {"model": "tiny", "prompt": prompt, "stream": True}
    async with http.post(router.url + path, json=body) as response:
        assert response.status == 200, await response.text()
        events: list[Any] = []
        async for line in response.content:
            line = line.rstrip(b"\n")
            if line.startswith(b"data: "):
                data = line[6:]
                events.append(data.decode() if data == b"[DONE]" else orjson.loads(data))
                if after_first_event is not None and len(events) == 1:
                    after_first_event()
                    start = time.monotonic()
            elif line.startswith(b"event: "):
                events.append(line.decode())
    return response.headers[REPLICA_HEADER], events, time.monotonic() - start


def failed_mid_stream(replica: str, failure: str) -> dict:
    return {"error": {"message": f"The replica {replica} failed mid-stream: {failure}.",
                      "type": "service_unavailable_error", "param": None,
                      "code": "upstream_failed"}}


@pytest_asyncio.fixture
async def good(replicas: list[FakeReplica]) -> FakeReplica:
    b = replicas[1]
    b.release_stream.set()  # its streams run to [DONE] at once
    return b


@pytest_asyncio.fixture
async def raw_replica() -> AsyncIterator[Callable[..., Any]]:
    started: list[RawReplica] = []

    async def start(fault: Any) -> RawReplica:
        replica = await RawReplica(fault).start()
        started.append(replica)
        return replica

    yield start
    for replica in started:
        await replica.stop()


async def router_over(make_router: Any, faulty: str, good: FakeReplica,
                      **overrides: Any) -> Router:
    overrides.setdefault("stream_idle_timeout", LONG_S)
    return await make_router([faulty, good.url], policy="round-robin", **overrides)


async def test_hang_before_first_byte_with_health_alive_is_retried_after_the_idle_timeout(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    a.hang = True
    router = await router_over(make_router, a.url, good, stream_idle_timeout=IDLE_S)
    replica, events, seconds = await stream(http, router)
    assert (replica, events) == (good.url, GOOD_STREAM)
    assert IDLE_S <= seconds < IDLE_S + MARGIN_S
    hung = router.state.replicas.replicas[a.url]
    assert (hung.healthy, hung.failures) == (True, 1)  # counted, one short of ejection
    assert await metric(http, router, f'pagedserve:router_retries_total{{replica="{a.url}"}}') == 1


async def test_hang_before_first_byte_with_health_dead_is_retried_at_ejection(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    a.hang = True
    router = await router_over(make_router, a.url, good, health_interval=HEALTH_S,
                               health_timeout=HEALTH_S)
    request = asyncio.create_task(stream(http, router))
    while not a.requests:  # the request waits on a; then a's /health stops answering
        await asyncio.sleep(0.01)
    a.health_hangs = True
    start = time.monotonic()
    replica, events, _ = await request
    assert (replica, events) == (good.url, GOOD_STREAM)
    assert time.monotonic() - start < 2 * HEALTH_S + MARGIN_S < LONG_S
    assert not router.state.replicas.replicas[a.url].healthy


async def test_hang_after_first_byte_with_health_alive_ends_with_an_error_event(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    router = await router_over(make_router, a.url, good, stream_idle_timeout=IDLE_S)
    replica, events, seconds = await stream(http, router)
    assert (replica, events) == (a.url, [
        {"replica": "a", "chunk": 1},
        failed_mid_stream(a.url, f"no event for {IDLE_S:g} s"), "[DONE]"])
    assert IDLE_S <= seconds < IDLE_S + MARGIN_S
    assert router.state.replicas.replicas[a.url].failures == 1
    assert await metric(
        http, router, f'pagedserve:router_broken_streams_total{{replica="{a.url}"}}') == 1


async def test_hang_after_first_byte_with_health_dead_ends_at_ejection(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    router = await router_over(make_router, a.url, good, health_interval=HEALTH_S,
                               health_timeout=HEALTH_S)

    def stop_answering_health() -> None:
        a.health_hangs = True

    replica, events, seconds = await stream(http, router,
                                            after_first_event=stop_answering_health)
    assert (replica, events) == (a.url, [
        {"replica": "a", "chunk": 1},
        failed_mid_stream(a.url, "it was ejected"), "[DONE]"])
    assert seconds < 2 * HEALTH_S + MARGIN_S < LONG_S
    assert not router.state.replicas.replicas[a.url].healthy


async def test_a_stalled_stream_on_the_responses_api_ends_with_its_error_event(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    router = await router_over(make_router, a.url, good, stream_idle_timeout=IDLE_S)
    _, events, _ = await stream(http, router, "/v1/responses")
    message = f"The replica {a.url} failed mid-stream: no event for {IDLE_S:g} s."
    # As the server ends a Responses stream: a typed error event, and no [DONE].
    assert events == [{"replica": "a", "chunk": 1}, "event: error",
                      {"type": "error", "code": "upstream_failed", "message": message,
                       "param": None}]


async def test_500_is_retried_and_counts_toward_ejection(replicas, good, make_router,
                                                         http) -> None:
    a = replicas[0]
    a.status, a.error_code = 500, "request_failed"
    router = await make_router([a.url, good.url], stream_idle_timeout=LONG_S)
    prompt = prompts_homed_on(router, a.url)[0]  # each request goes to a first
    for failures in (1, 2):
        replica, events, _ = await stream(http, router, prompt=prompt)
        assert (replica, events) == (good.url, GOOD_STREAM)
        assert router.state.replicas.replicas[a.url].failures == failures
    assert not router.state.replicas.replicas[a.url].healthy  # the second failure ejects
    assert len(a.requests) == 2


async def test_an_ejection_for_errors_leaves_the_replicas_streams_running(
        replicas, good, make_router, http) -> None:
    a = replicas[0]
    router = await make_router([a.url, good.url], stream_idle_timeout=LONG_S)
    prompt = prompts_homed_on(router, a.url)[0]
    running = asyncio.create_task(stream(http, router, prompt=prompt))
    while not a.requests:  # a's stream is open, its second chunk held back
        await asyncio.sleep(0.01)
    a.status, a.error_code = 500, "request_failed"
    for _ in range(2):
        assert (await stream(http, router, prompt=prompt))[:2] == (good.url, GOOD_STREAM)
    assert not router.state.replicas.replicas[a.url].healthy
    a.release_stream.set()  # answering, though with errors: its stream ends as it would
    replica, events, _ = await running
    assert (replica, events) == (a.url, [{"replica": "a", "chunk": 1},
                                         {"replica": "a", "chunk": 2}, "[DONE]"])


async def test_a_full_replica_is_retried_without_counting(replicas, good, make_router,
                                                          http) -> None:
    a = replicas[0]
    a.status, a.error_code = 503, "too_many_connections"
    router = await router_over(make_router, a.url, good)
    replica, events, _ = await stream(http, router)
    assert (replica, events) == (good.url, GOOD_STREAM)
    full = router.state.replicas.replicas[a.url]
    assert (full.healthy, full.failures) == (True, 0)


@pytest.mark.parametrize("fault", [reset, empty_stream], ids=["reset", "empty_stream"])
async def test_a_failure_before_the_first_byte_is_retried(good, make_router, raw_replica, http,
                                                          fault) -> None:
    a = await raw_replica(fault)
    router = await router_over(make_router, a.url, good)
    replica, events, seconds = await stream(http, router)
    assert (replica, events, a.requests) == (good.url, GOOD_STREAM, 1)
    assert seconds < MARGIN_S
    assert router.state.replicas.replicas[a.url].failures == 1


@pytest.mark.parametrize(("fault", "failure"), [
    (truncated, "it ended without [DONE] or a finish reason"),
    (reset_after_first_event, "it broke: ClientPayloadError"),
], ids=["truncated_close_framed", "reset_after_first_byte"])
async def test_a_stream_cut_short_ends_with_an_error_event(good, make_router, raw_replica, http,
                                                           fault, failure) -> None:
    a = await raw_replica(fault)
    router = await router_over(make_router, a.url, good)
    replica, events, seconds = await stream(http, router)
    assert replica == a.url
    assert events[0] == {"replica": "raw", "chunk": 1}
    assert events[2:] == ["[DONE]"]
    message = events[1]["error"]["message"]
    prefix = f"The replica {a.url} failed mid-stream: {failure}"
    assert message.startswith(prefix), message
    assert events[1] == failed_mid_stream(a.url, message[len(prefix) - len(failure):-1])
    assert seconds < MARGIN_S
    assert router.state.replicas.replicas[a.url].failures == 1
