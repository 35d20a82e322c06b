"""The asyncio client against a live pagedserve server: typed answers equal to the offline
engine's greedy output, exact token counts from ``/tokenize``, and whole batches (fixed and
adaptive budgets, cancel and resume, per-item 400s) with one result per id."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from pagedserve.client import (
    AsyncClient,
    BatchRequest,
    ItemError,
    PoolConfig,
    RunOptions,
    ServerTokenCounter,
    TiktokenCounter,
    build_pool,
    run_batch,
    run_batch_file,
)
from pagedserve.client.api.client_errors import APIStreamError
from pagedserve.client.api.response_types import Response, ResponseStreamEvent
from pagedserve.client.api.types import ChatCompletion, Completion, Usage
from pagedserve.client.budget.tokens import PromptCount
from pagedserve.common.load_hints import LoadHints
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.core.outputs import CompletionOutput
from tests.api.live_server import LiveServer
from tests.integration.batch_items import (
    answer_text,
    expected_answers,
    item_id,
    make_items,
    prompt_text,
    read_jsonl,
    write_jsonl,
)
from tests.integration.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    NUM_KV_BLOCKS,
    PeakLoad,
)
from tests.live_model import MODEL

PROMPT = "The paged KV cache"
OTHER_PROMPT = "Blocks of sixteen tokens"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a cache."},
]
NUM_ITEMS = 30
KV_TOKENS = NUM_KV_BLOCKS * BLOCK_SIZE


def greedy(offline: LLM, prompt_ids: list[int], max_tokens: int,
           ignore_eos: bool = False) -> CompletionOutput:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    return offline.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0]


def chat_ids(offline: LLM) -> list[int]:
    tokenizer = offline.get_tokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def usage_of(prompt_ids: list[int], output: CompletionOutput) -> Usage:
    generated = len(output.token_ids)
    return Usage(len(prompt_ids), generated, len(prompt_ids) + generated)


async def test_completion_equals_offline_engine(client: AsyncClient, offline: LLM) -> None:
    prompt_ids = offline.get_tokenizer().encode(PROMPT)
    expected = greedy(offline, prompt_ids, 8)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                             temperature=0)
    assert isinstance(result, Completion)
    (choice,) = result.choices
    assert (choice.index, choice.text, choice.finish_reason) == (
        0, expected.text, expected.finish_reason)
    assert result.usage == usage_of(prompt_ids, expected)
    assert result.model == MODEL and result.id.startswith("cmpl-")
    assert LoadHints.from_headers(result.response_headers) is not None


async def test_completion_stream_equals_offline_engine(client: AsyncClient,
                                                       offline: LLM) -> None:
    prompt_ids = offline.get_tokenizer().encode(PROMPT)
    expected = greedy(offline, prompt_ids, 6, ignore_eos=True)
    stream = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, ignore_eos=True,
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    *token_chunks, usage_chunk = chunks
    assert len(token_chunks) == 6
    assert "".join(c.choices[0].text for c in token_chunks) == expected.text
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 5 + ["length"]
    assert (usage_chunk.choices, usage_chunk.usage) == ([], usage_of(prompt_ids, expected))
    assert LoadHints.from_headers(stream.headers) is not None


async def test_chat_equals_offline_engine(client: AsyncClient, offline: LLM) -> None:
    prompt_ids = chat_ids(offline)
    expected = greedy(offline, prompt_ids, 8)
    result = await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                  max_tokens=8, temperature=0)
    assert isinstance(result, ChatCompletion)
    (choice,) = result.choices
    assert (choice.message.role, choice.message.content) == ("assistant", expected.text)
    assert choice.finish_reason == expected.finish_reason
    assert result.usage == usage_of(prompt_ids, expected)


async def test_chat_stream_equals_offline_engine(client: AsyncClient, offline: LLM) -> None:
    prompt_ids = chat_ids(offline)
    expected = greedy(offline, prompt_ids, 5, ignore_eos=True)
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, ignore_eos=True,
    )
    *token_chunks, usage_chunk = [chunk async for chunk in stream]
    # The role rides on the first token's chunk: one chunk per token, nothing before.
    assert [c.choices[0].delta.role for c in token_chunks] == ["assistant"] + [None] * 4
    assert "".join(c.choices[0].delta.content or "" for c in token_chunks) == expected.text
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert usage_chunk.usage == usage_of(prompt_ids, expected)


async def test_responses_equal_offline_engine(client: AsyncClient, offline: LLM) -> None:
    prompt_ids = chat_ids(offline)
    expected = greedy(offline, prompt_ids, 6)
    result = await client.responses.create(model=MODEL, instructions="You are terse.",
                                           input="Name a cache.", max_output_tokens=6,
                                           temperature=0)
    assert isinstance(result, Response)
    assert result.output_text == expected.text
    assert result.usage == usage_of(prompt_ids, expected)
    assert result.status == ("incomplete" if expected.finish_reason == "length"
                             else "completed")
    stream = await client.responses.create(model=MODEL, instructions="You are terse.",
                                           input="Name a cache.", max_output_tokens=6,
                                           temperature=0, stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events
                   if e.type == "response.output_text.delta") == expected.text
    assert events[-1].response.output_text == expected.text
    assert events[-1].response.usage == usage_of(prompt_ids, expected)


def test_an_error_event_raises() -> None:
    event = {"type": "error", "code": None, "message": "the engine failed", "param": None}
    with pytest.raises(APIStreamError, match=r"^the engine failed$"):
        ResponseStreamEvent.from_dict(event)


@pytest.mark.parametrize("kind, body", [
    ("completions", {"prompt": PROMPT}),
    ("completions", {"prompt": [PROMPT, OTHER_PROMPT]}),
    ("chat", {"messages": MESSAGES}),
], ids=["prompt", "two-prompts", "chat"])
async def test_server_counter_equals_usage(client: AsyncClient, kind: str,
                                           body: dict) -> None:
    counter = ServerTokenCounter(client, model=MODEL)
    count = await counter.count(kind, body)
    resource = client.chat.completions if kind == "chat" else client.completions
    result = await resource.create(model=MODEL, max_tokens=1, temperature=0, **body)
    assert count == PromptCount(result.usage.prompt_tokens, MAX_MODEL_LEN)


async def test_responses_in_a_batch(server: LiveServer, client: AsyncClient, offline: LLM,
                                    tmp_path: Path) -> None:
    # OpenAI batch lines for /v1/responses: counted exactly through /tokenize, answered once
    # each, with the offline engine's text for the chat-templated conversation.
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": MODEL, "instructions": "You are terse.",
                       "input": [{"role": "user", "content": [
                           {"type": "input_text", "text": f"Name cache {i}."}]}],
                       "max_output_tokens": 4, "temperature": 0}} for i in range(6)]
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    pool = PoolConfig(base_urls=[server.base_url], max_inflight_tokens=4096)
    summary = await run_batch_file(source, output, pool,
                                   RunOptions(counter="server"))
    assert (summary.succeeded, summary.failed) == (6, 0)
    tokenizer = offline.get_tokenizer()
    for record in read_jsonl(output):
        i = int(record["custom_id"][1:])
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": f"Name cache {i}."}]
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages),
                               add_special_tokens=False)
        want = greedy(offline, ids, 4)
        body = record["response"]["body"]
        assert body["object"] == "response"
        assert body["output"][0]["content"][0]["text"] == want.text
        assert body["usage"]["input_tokens"] == len(ids)
        count = await ServerTokenCounter(client, model=MODEL).count("responses",
                                                                    lines[i]["body"])
        assert count == PromptCount(len(ids), MAX_MODEL_LEN)


def most_admitted(reservations: list[int], budget: int) -> int:
    """The most of these reservations that fit a budget together: the smallest first."""
    total = admitted = 0
    for tokens in sorted(reservations):
        total += tokens
        if total > budget:
            break
        admitted += 1
    return admitted


@pytest.mark.parametrize("mode", ["fixed", "auto"])
async def test_batch_file_answers_every_item_once(
    server: LiveServer, offline: LLM, peak_load: PeakLoad, tmp_path: Path, mode: str
) -> None:
    items = make_items(NUM_ITEMS)
    expected = expected_answers(offline, items)
    # The fixed budget holds two or three items; the adaptive one starts at the KV size.
    budget = 80 if mode == "fixed" else "auto"
    counter = "server" if mode == "fixed" else "tiktoken"
    source, target = write_jsonl(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    peak_load.reset()
    summary = await run_batch_file(
        source, target, PoolConfig([server.base_url], max_inflight_tokens=budget),
        RunOptions(counter=counter),
    )
    records = {r["custom_id"]: r for r in read_jsonl(target)}
    assert len(read_jsonl(target)) == len(records) == NUM_ITEMS
    for item in items:
        record = records[item.custom_id]
        assert record["error"] is None and record["response"]["status_code"] == 200
        body, want = record["response"]["body"], expected[item.custom_id]
        assert body["model"] == MODEL
        assert answer_text(item.kind, body) == want.text
        assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (
            want.prompt_tokens, want.completion_tokens)
    assert (summary.succeeded, summary.failed, summary.skipped) == (NUM_ITEMS, 0, 0)
    assert summary.prompt_tokens == sum(w.prompt_tokens for w in expected.values())
    assert summary.completion_tokens == sum(w.completion_tokens for w in expected.values())
    if mode == "fixed":
        reservations = [w.prompt_tokens + 8 for w in expected.values()]
        assert peak_load.value <= most_admitted(reservations, budget) < NUM_ITEMS


async def test_auto_budget_is_planned_from_the_servers_load(server: LiveServer) -> None:
    async with await build_pool(PoolConfig([server.base_url])) as pool:
        (endpoint,) = pool.endpoints
        plan = endpoint.adaptive.plan
        safe = int(0.9 * KV_TOKENS)
        assert (plan.initial_tokens, plan.max_tokens, plan.kv_tokens) == (
            safe, 4 * KV_TOKENS, KV_TOKENS)
        assert (plan.max_concurrency, plan.waiting_high) == (2 * MAX_NUM_SEQS, 2)
        assert (endpoint.budget.capacity, endpoint.budget.hard_limit) == (safe, 4 * KV_TOKENS)
        assert endpoint.budget.max_concurrency == min(16, 2 * MAX_NUM_SEQS)


def gated_counter(release_below: int,
                  prompts: dict[str, int]) -> Callable[[str, dict], Awaitable[int]]:
    """Counts with tiktoken, but holds every item from ``release_below`` on forever, so a
    run can be cancelled with a known set of items still unsent."""
    tiktoken = TiktokenCounter()
    never = asyncio.Event()

    async def count(kind: str, body: dict) -> int:
        if prompts[body["prompt"]] >= release_below:
            await never.wait()
        return tiktoken.count_text(body["prompt"])

    return count


async def wait_for_lines(path: Path, count: int, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if path.exists() and len(read_jsonl(path)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never reached {count} lines")


async def test_cancel_then_resume_gives_one_result_per_id(server: LiveServer, offline: LLM,
                                                          tmp_path: Path) -> None:
    # Items 8 and 9 are long, so they are usually still generating at the cancel.
    items = make_items(NUM_ITEMS, lambda i: 200 if i in (8, 9) else 4, chat_every=0)
    for item in items:
        item.body["ignore_eos"] = True
    source, target = write_jsonl(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    config = PoolConfig([server.base_url], max_inflight_tokens=1024)
    prompts = {prompt_text(i): i for i in range(NUM_ITEMS)}
    first = asyncio.create_task(run_batch_file(
        source, target, config, RunOptions(counter=gated_counter(10, prompts))))
    await wait_for_lines(target, 8)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    done_first = target.read_bytes()
    first_ids = [r["custom_id"] for r in read_jsonl(target)]
    assert 8 <= len(first_ids) <= 10
    assert set(first_ids) <= {item_id(i) for i in range(10)}
    await asyncio.to_thread(server.wait_idle, KV_TOKENS)

    summary = await run_batch_file(source, target, config)
    assert (summary.skipped, summary.succeeded, summary.failed) == (
        len(first_ids), NUM_ITEMS - len(first_ids), 0)
    assert target.read_bytes().startswith(done_first)
    records = read_jsonl(target)
    assert Counter(r["custom_id"] for r in records) == Counter(i.custom_id for i in items)
    expected = expected_answers(offline, items)
    for record in records:
        body, want = record["response"]["body"], expected[record["custom_id"]]
        assert body["usage"]["completion_tokens"] == want.completion_tokens
        # Over 200 tokens of a random model, float noise from the batch's shape can flip a
        # near-tie, so only the short answers are compared token for token.
        if want.completion_tokens == 4:
            assert body["choices"][0]["text"] == want.text


async def test_server_400_fails_only_its_item(server: LiveServer, client: AsyncClient) -> None:
    items = make_items(5, lambda i: 300 if i == 2 else 4, chat_every=0)
    requests = [BatchRequest(i.custom_id, "completions", {"model": MODEL, **i.body})
                for i in items]
    prompt_tokens = (await client.tokenize(MODEL, prompt=prompt_text(2))).count
    message = (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
        f"requested {prompt_tokens + 300} tokens ({prompt_tokens} in the prompt, 300 for the "
        f"completion). Please reduce the prompt or max_tokens."
    )
    config = PoolConfig([server.base_url], max_inflight_tokens=512)
    results, summary = await run_batch(requests, config, RunOptions(counter="server"))
    assert [r.custom_id for r in results] == [i.custom_id for i in items]
    bad = results[2]
    assert bad.error == ItemError("BadRequestError", f"400 Bad Request: {message}", "400")
    assert (bad.status_code, bad.attempts, bad.usage) == (400, 1, None)
    assert bad.response == {"error": {"message": message, "type": "invalid_request_error",
                                      "param": "max_tokens", "code": None}}
    good = [r for r in results if r.custom_id != bad.custom_id]
    assert all(r.ok and r.status_code == 200 and r.usage.completion_tokens == 4
               for r in good)
    assert (summary.succeeded, summary.failed, dict(summary.errors)) == (
        4, 1, {"BadRequestError": 1})
