"""Two live replicas of different capacity behind one adaptive pool: every item is answered
exactly once, with the offline engine's greedy text, also when one replica stops mid-run."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedserve.client import BatchRequest, BatchResult, PoolConfig, RunOptions, run_batch
from pagedserve.client.api.retry import RetryPolicy
from pagedserve.server import LLM
from tests.api.live_server import LiveServer, server_config
from tests.integration.batch_items import Item, answer_text, expected_answers, make_items
from tests.integration.conftest import BLOCK_SIZE, MAX_MODEL_LEN
from tests.live_model import MODEL

NUM_ITEMS = 40


def replica(model_dir: Path, num_kv_blocks: int, max_num_seqs: int) -> LiveServer:
    engine = {"max_model_len": MAX_MODEL_LEN, "num_kv_blocks": num_kv_blocks,
              "block_size": BLOCK_SIZE, "max_num_seqs": max_num_seqs}
    return LiveServer(server_config(str(model_dir), engine=engine)).start()


@pytest.fixture
def small(model_dir: Path) -> Iterator[LiveServer]:
    """Half the KV cache of the shared ``server`` and a quarter of its batch."""
    live = replica(model_dir, num_kv_blocks=32, max_num_seqs=4)
    yield live
    if live.port and live._thread.is_alive():
        live.stop()


def requests(items: list[Item]) -> list[BatchRequest]:
    return [BatchRequest(i.custom_id, i.kind, {**i.body, "model": MODEL}) for i in items]


def check_exactly_once(results: list[BatchResult], items: list[Item], offline: LLM) -> None:
    expected = expected_answers(offline, items)
    assert Counter(r.custom_id for r in results) == Counter(i.custom_id for i in items)
    for result, item in zip(results, items, strict=True):
        assert result.ok, result.error
        want = expected[item.custom_id]
        assert answer_text(item.kind, result.response) == want.text
        assert result.usage is not None
        assert result.usage.completion_tokens == want.completion_tokens


async def test_uneven_replicas_share_the_work(server: LiveServer, small: LiveServer,
                                              offline: LLM) -> None:
    items = make_items(NUM_ITEMS, max_tokens=lambda i: 6 + i % 5)
    config = PoolConfig([server.base_url, small.base_url], max_inflight_tokens="auto")
    results, summary = await run_batch(requests(items), config)
    check_exactly_once(results, items, offline)
    served = Counter(r.endpoint for r in results)
    assert set(served) == {server.base_url, small.base_url}
    assert (summary.succeeded, summary.failed) == (NUM_ITEMS, 0)


async def test_a_replica_stopped_mid_run_loses_and_repeats_nothing(
        server: LiveServer, small: LiveServer, offline: LLM) -> None:
    # Long answers (ignore_eos), so the small replica is mid-generation when it stops.
    items = make_items(NUM_ITEMS, max_tokens=lambda i: 40 + i % 9, chat_every=0)
    for item in items:
        item.body["ignore_eos"] = True
    config = PoolConfig([server.base_url, small.base_url], max_inflight_tokens="auto",
                        cooldown=RetryPolicy(initial_backoff=0.05, max_backoff=0.5))
    small_busy = asyncio.Event()

    def on_result(result: BatchResult) -> None:
        if result.endpoint == small.base_url and small.engine.stats().num_running > 0:
            small_busy.set()

    async def stop_small() -> None:
        await small_busy.wait()
        await asyncio.to_thread(small.stop)

    stopper = asyncio.create_task(stop_small())
    results, summary = await run_batch(
        requests(items), config, RunOptions(extra={"on_result": on_result}))
    await asyncio.wait_for(stopper, 30)
    assert Counter(r.custom_id for r in results) == Counter(i.custom_id for i in items)
    assert (summary.succeeded, summary.failed) == (NUM_ITEMS, 0)
    for result, item in zip(results, items, strict=True):
        assert result.usage is not None
        assert result.usage.completion_tokens == item.body["max_tokens"]
    # What ran on the small replica when it stopped was tried again, and answered once, by
    # the replica left.
    retried = [r for r in results if r.attempts > 1]
    assert retried and all(r.endpoint == server.base_url for r in retried)
