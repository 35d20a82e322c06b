from __future__ import annotations

import asyncio
import io
import socket
from collections import Counter

import pytest

from pagedserve.client import (
    AsyncClient,
    BatchRequest,
    BatchRunner,
    PoolConfig,
    RetryPolicy,
    ServerTokenCounter,
    Timeout,
    build_pool,
)
from pagedserve.client.api.types import Usage
from pagedserve.client.batch.items import BatchResult, BatchSummary, ItemError
from pagedserve.client.batch.progress import BatchProgress
from pagedserve.common.load_hints import LoadHints

FAST = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, jitter=0.0)


def requests(n: int, max_tokens: int = 4, prefix: str = "p") -> list[BatchRequest]:
    return [
        BatchRequest(f"id-{i}", "completions",
                     {"model": "m", "prompt": f"{prefix}{i}", "max_tokens": max_tokens})
        for i in range(n)
    ]


async def pool_for(urls: list[str], tokens: int | str = 10_000, total: float = 5.0, **kwargs):
    config = PoolConfig(base_urls=urls, max_inflight_tokens=tokens, cooldown=FAST,
                        timeout=Timeout(total=total), **kwargs)
    return await build_pool(config)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_faults_every_item_completes_exactly_once(serve):
    script = {
        "p1": [("status", 429, {"retry-after-ms": "200"})],
        "p2": [("status", 500), ("status", 503)],
        "p3": [("slow", 0.6)],
        "p4": [("drop",)],
        "p5": [("status", 400)],
        "p6": [("status", 503)] * 10,
    }
    server, url = await serve(script=script)
    async with await pool_for([url], total=0.3) as pool:
        runner = BatchRunner(pool, max_attempts=3)
        results = await runner.run(requests(12))
    assert [r.custom_id for r in results] == [f"id-{i}" for i in range(12)]
    assert [r.index for r in results] == list(range(12))
    failed = {r.custom_id: r for r in results if not r.ok}
    assert sorted(failed) == ["id-5", "id-6"]
    assert failed["id-5"].error == ItemError(
        "BadRequestError", "400 Bad Request: injected 400", "400"
    )
    assert (failed["id-5"].status_code, failed["id-5"].attempts) == (400, 1)
    assert failed["id-5"].response["error"]["message"] == "injected 400"
    assert failed["id-6"].error == ItemError(
        "InternalServerError", "503 Service Unavailable: injected 503", "503"
    )
    assert failed["id-6"].attempts == 3
    for result in results:
        if result.ok and result.index != 3:  # p3's first answer went out after the timeout
            key = f"p{result.index}"
            delivered = [a for a in server.answers_for(key) if a.status == 200 and not a.dropped]
            assert len(delivered) == 1, key
            assert result.response["choices"][0]["text"] == " tok0 tok1 tok2 tok3"
            assert result.usage.completion_tokens == 4
    assert [r.attempts for r in results[1:5]] == [2, 3, 2, 2]
    assert len(server.arrivals_for("p3")) == 2
    rejected, retried = server.answers_for("p1")[0], server.arrivals_for("p1")[1]
    assert rejected.status == 429
    assert retried.at - rejected.at >= 0.2
    summary = runner.summary
    assert (summary.submitted, summary.succeeded, summary.failed) == (12, 10, 2)
    assert summary.errors == Counter({"BadRequestError": 1, "InternalServerError": 1})


async def test_budget_is_never_exceeded(serve):
    server, url = await serve(delay=0.02)
    batch = requests(30, max_tokens=20)
    async with await pool_for([url], tokens=100) as pool:
        results = await BatchRunner(pool).run(batch)
        assert pool.in_flight_tokens == 0
    assert all(r.ok for r in results)
    assert len(server.arrivals) == 30
    assert 0 < server.max_in_flight_tokens <= 100
    assert sorted(a.reserved for a in server.arrivals) == sorted(
        server.count(f"p{i}") + 20 for i in range(30)
    )


async def test_too_large_request_fails_at_once(serve):
    server, url = await serve()
    batch = requests(3)
    batch.insert(1, BatchRequest("huge", "completions",
                                 {"model": "m", "prompt": "big", "max_tokens": 500}))
    async with await pool_for([url], tokens=100) as pool:
        results = await BatchRunner(pool).run(batch)
    huge = results[1]
    assert huge.error == ItemError(
        "BudgetExceededError",
        "request needs 501 tokens but the in-flight token budget is 100",
        "budget_exceeded",
    )
    assert huge.attempts == 0
    assert [r.ok for r in results] == [True, False, True, True]
    assert server.arrivals_for("big") == []


async def test_stream_in_a_batch_is_refused(serve):
    _, url = await serve()
    batch = [BatchRequest("s", "completions", {"model": "m", "prompt": "x", "stream": True})]
    async with await pool_for([url]) as pool:
        (result,) = await BatchRunner(pool).run(batch)
    assert result.error == ItemError(
        "InvalidRequestError", "stream must be false in a batch, got True", "invalid_request"
    )


async def test_failing_endpoints_hand_their_work_to_a_healthy_one(serve):
    batch = requests(10)
    broken, broken_url = await serve(script={f"p{i}": [("status", 503)] * 10 for i in range(10)})
    healthy, healthy_url = await serve()
    refused_url = f"http://127.0.0.1:{_free_port()}"
    async with await pool_for([broken_url, refused_url, healthy_url]) as pool:
        results = await BatchRunner(pool, max_attempts=6).run(batch)
        broken_endpoint = pool.endpoints[0]
    assert all(r.ok for r in results)
    assert {r.endpoint for r in results} == {healthy_url}
    assert len(healthy.arrivals) == 10
    assert len(broken.arrivals) >= 1 and broken_endpoint.failed == len(broken.arrivals)


async def test_a_dead_engine_fails_fast_alone_and_hands_work_over_in_a_pool(serve):
    dead = [("status", 503, {}, "engine_dead")] * 10
    alone, alone_url = await serve(script={"p0": dead})
    async with await pool_for([alone_url]) as pool:
        (result,) = await BatchRunner(pool, max_attempts=6).run(requests(1))
    assert (result.ok, result.attempts, result.error.code) == (False, 1, "engine_dead")
    assert len(alone.arrivals) == 1
    broken, broken_url = await serve(script={f"p{i}": dead for i in range(4)})
    healthy, healthy_url = await serve()
    async with await pool_for([broken_url, healthy_url]) as pool:
        results = await BatchRunner(pool, max_attempts=6).run(requests(4))
    assert all(r.ok for r in results) and len(healthy.arrivals) == 4
    assert 1 <= len(broken.arrivals) <= 4


async def test_results_as_completed_or_in_input_order(serve):
    script = {"p0": [("after", 3)]}  # the first item answers only after the other three
    for ordered, expected in ((False, ["id-1", "id-2", "id-3", "id-0"]),
                              (True, ["id-0", "id-1", "id-2", "id-3"])):
        _, url = await serve(script={k: list(v) for k, v in script.items()})
        async with await pool_for([url]) as pool:
            runner = BatchRunner(pool)
            got = [r.custom_id async for r in runner.results(requests(4), ordered=ordered)]
        assert sorted(got[:3]) == expected[:3] if not ordered else got == expected
        assert got[-1] == expected[-1]


async def test_cancelling_stops_workers_and_frees_the_budget(serve):
    server, url = await serve(delay=0.05)
    async with await pool_for([url], tokens=60) as pool:
        runner = BatchRunner(pool)
        seen = []

        async def consume():
            async for result in runner.results(requests(40)):
                seen.append(result)

        task = asyncio.create_task(consume())
        while len(seen) < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert (pool.in_flight_tokens, pool.endpoints[0].budget.in_flight_requests) == (0, 0)
        sent = len(server.arrivals)
        await asyncio.sleep(0.1)
        assert len(server.arrivals) == sent  # nothing more goes out
    assert len(seen) < 40


async def test_adaptive_budget_follows_load_hints(serve):
    load = {"kv_cache_usage": 0.0, "num_waiting": 0, "num_running": 0,
            "free_token_capacity": 200, "num_preemptions": 0, "max_num_seqs": 4,
            "max_num_batched_tokens": 256, "total_kv_tokens": 200}

    def hints(server) -> LoadHints:
        # The server starts preempting from its sixth answer on.
        return LoadHints(0.5, 0, 2, 100, max(0, len(server.answers) - 5))

    server, url = await serve(load=load, hints=hints, delay=0.01)
    async with await pool_for([url], tokens="auto") as pool:
        endpoint = pool.endpoints[0]
        # 0.9 of the KV size (the last blocks are part empty), a window of 8 requests.
        assert (endpoint.budget.capacity, endpoint.budget.hard_limit) == (180, 800)
        assert endpoint.budget.max_concurrency == 8
        results = await BatchRunner(pool).run(requests(20, max_tokens=10))
    assert all(r.ok for r in results)
    history = list(endpoint.adaptive.history)
    assert history[0] == ("start", 8, 180)
    assert ("preemption", 4, 162) in history  # half the window, 0.9 of the safe share
    assert server.max_in_flight_tokens <= 180


@pytest.mark.parametrize("answered", [False, True], ids=["silent", "answers-bring-hints"])
async def test_load_is_polled_only_while_answers_bring_no_hints(serve, answered):
    # The pool's clock stands still: a hint observed "now" stays recent for the whole slow
    # request, and the watch leaves /load alone; without one it reads /load while it waits.
    load = {"kv_cache_usage": 0.0, "num_waiting": 0, "num_running": 0,
            "free_token_capacity": 200, "num_preemptions": 0, "max_num_seqs": 4,
            "max_num_batched_tokens": 256, "total_kv_tokens": 200}
    server, url = await serve(load=load, delay=0.4)
    async with await pool_for([url], tokens="auto") as pool:
        pool._clock = lambda: 100.0
        endpoint = pool.endpoints[0]
        if answered:
            endpoint.adaptive.observe(LoadHints(0.1, 0, 1, 180, 0), now=100.0)
        before = server.load_calls
        results = await BatchRunner(pool).run(requests(1, max_tokens=10))
    assert all(r.ok for r in results)
    polls = server.load_calls - before
    assert polls == 0 if answered else polls >= 1


async def test_adaptive_budget_cuts_on_429_without_hints(serve):
    _, url = await serve(script={"p0": [("status", 429)]})
    async with await pool_for([url], tokens="auto") as pool:
        endpoint = pool.endpoints[0]
        assert endpoint.budget.capacity == 32_768  # no /load: the fixed fallback
        results = await BatchRunner(pool).run(requests(3))
    assert all(r.ok for r in results)
    # Without hints the window starts at the runner's 256 workers; the 429 halves it.
    assert ("rate-limited", 128, 32_768) in endpoint.adaptive.history


async def test_server_token_counter(serve):
    server, url = await serve()
    async with await pool_for([url], tokens=100) as pool, AsyncClient(url) as client:
        runner = BatchRunner(pool, counter=ServerTokenCounter(client))
        results = await runner.run(requests(2))
    assert all(r.ok for r in results)
    assert server.tokenize_bodies == [
        {"model": "m", "prompt": "p0"}, {"model": "m", "prompt": "p1"}
    ]


def test_progress_bar_shows_done_failed_rate_and_in_flight():
    summary = BatchSummary()
    out = io.StringIO()
    bar = BatchProgress(3, summary, lambda: 7, enabled=True, file=out)
    for i, error in enumerate([None, None, ItemError("BadRequestError", "x")]):
        summary.record(BatchResult(i, f"id-{i}", 200, {}, error, Usage(5, 5, 10), "u", 1))
        bar.advance()
    bar.close()
    final = out.getvalue().split("\r")[-1]
    assert "3/3" in final
    assert "req/s, ok=2, failed=1, tok/s=" in final and final.endswith(", inflight_tok=7]\n")
