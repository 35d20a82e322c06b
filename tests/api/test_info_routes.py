"""The small routes: models, version, health, load (and its headers), tokenize/detokenize."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from pagedserve.common.load_hints import LoadHints
from pagedserve.server.api.serving.pipeline import VERSION
from pagedserve.server.api.telemetry.hints import STEP_CLOCK_KEY, THROUGHPUT_CURVE_KEY
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer


async def get(server: LiveServer, path: str) -> tuple[int, Any, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(
        server.base_url + path
    ) as response:
        return response.status, await response.json(), dict(response.headers)


async def post(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + path, json=body
    ) as response:
        return response.status, await response.json()


async def test_models_through_the_sdk(client: AsyncOpenAI, server: LiveServer) -> None:
    models = await client.models.list()
    (card,) = models.data
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "pagedserve")
    assert card.model_extra["max_model_len"] == server.engine.max_model_len
    assert (await client.models.retrieve(MODEL)).id == MODEL


async def test_version_and_health(server: LiveServer) -> None:
    assert (await get(server, "/version"))[:2] == (200, {"version": VERSION})
    assert (await get(server, "/health"))[:2] == (200, {"status": "ok"})


async def test_load_reports_the_engine_state(server: LiveServer) -> None:
    server.wait_until(lambda s: s.num_running == 0)
    status, body, headers = await get(server, "/load")
    stats = server.engine.stats()
    best = server.app[THROUGHPUT_CURVE_KEY].best()
    assert status == 200
    assert body == {
        "kv_cache_usage": 0.0, "num_waiting": 0, "num_running": 0,
        "free_token_capacity": stats.total_kv_tokens, "num_preemptions": stats.num_preemptions,
        "max_num_seqs": 16, "max_num_batched_tokens": 512,
        "total_kv_tokens": 64 * 16,
        "step_ms": server.app[STEP_CLOCK_KEY].step_ms,
        "generated_tokens": stats.generation_tokens_total,
        "kv_projected_usage": 0.0,  # nothing held, nothing projected
        "best_running": best.running if best else None,
        "best_tokens_per_s": round(best.tokens_per_s, 1) if best else None,
    }
    expected = LoadHints.from_json(body)
    assert expected is not None
    if expected.step_ms is not None:  # a header carries the step time to the microsecond
        expected = dataclasses.replace(expected, step_ms=round(expected.step_ms, 3))
    assert LoadHints.from_headers(headers) == expected


async def test_streamed_responses_carry_load_hints_too(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "hints", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/completions", json=body
    ) as response:
        hints = LoadHints.from_headers(response.headers)
        await response.read()
    assert hints is not None
    assert hints.num_waiting + hints.num_running >= 0


async def test_tokenize_and_detokenize_round_trip(server: LiveServer) -> None:
    text = "Paged attention, block by block."
    tokenizer = server.engine.tokenizer
    status, tokenized = await post(server, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200
    assert tokenized == {"count": len(tokenizer.encode(text)),
                         "tokens": tokenizer.encode(text), "max_model_len": 1024}
    status, detokenized = await post(server, "/detokenize", {"tokens": tokenized["tokens"]})
    assert (status, detokenized) == (200, {"prompt": text})


async def test_tokenize_takes_add_special_tokens_as_vllm_does(server: LiveServer) -> None:
    # vLLM's benchmark client sends this to line its prompts up with the server's tokenizer.
    text = "Paged attention"
    tokenizer = server.engine.tokenizer
    bos, plain = tokenizer.bos_token_id, tokenizer.encode(text, add_special_tokens=False)
    status, tokenized = await post(
        server, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert (status, tokenized["tokens"]) == (200, plain)
    status, tokenized = await post(
        server, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": True})
    assert (status, tokenized["tokens"]) == (200, [bos, *plain])
    messages = [{"role": "user", "content": text}]
    _, chat = await post(server, "/tokenize", {"messages": messages})
    _, framed = await post(server, "/tokenize", {"messages": messages, "add_special_tokens": True})
    assert chat["tokens"][0] != bos
    assert framed["tokens"] == [bos, *chat["tokens"]]
    status, error = await post(server, "/tokenize", {"prompt": text, "add_special_tokens": "no"})
    assert status == 400
    assert error["error"]["param"] == "add_special_tokens"


async def test_load_projects_the_kv_a_running_request_will_need(server: LiveServer) -> None:
    # 400 tokens to come: at least 25 of the cache's 64 blocks of 16 once it runs, far more
    # than it holds after its first token.
    body = {"model": MODEL, "prompt": "project", "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/completions", json=body
    ) as response:
        await response.content.readline()  # the first token: the request runs
        status, load, _ = await get(server, "/load")
    assert status == 200
    assert load["num_running"] == 1
    assert load["kv_projected_usage"] >= 25 / 64
    assert load["kv_projected_usage"] > load["kv_cache_usage"]
