from __future__ import annotations

import asyncio

import pytest

from pagedserve.client import (
    APIResponseValidationError,
    APITimeoutError,
    AsyncClient,
    RetryPolicy,
    StreamInterruptedError,
    Timeout,
)
from pagedserve.client.api.types import ChatCompletionChunk, CompletionChunk

FAST = RetryPolicy(max_retries=2, initial_backoff=0.01, max_backoff=0.02, jitter=0.0)


async def test_stream_yields_typed_chunks_and_returns_the_connection(serve):
    _, url = await serve(stream_chunks=3)
    async with AsyncClient(url) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        async with stream:
            chunks = [chunk async for chunk in stream]
        assert all(isinstance(c, CompletionChunk) for c in chunks)
        assert [c.choices[0].text for c in chunks] == [" tok0", " tok1", " tok2", ""]
        assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "length"]
        assert stream.chunks_received == 4
        connector = client._get_session().connector
        assert connector is not None and len(connector._acquired) == 0


async def test_chat_stream_deltas(serve):
    _, url = await serve(stream_chunks=2)
    async with AsyncClient(url) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async with stream:
            chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert [(c.choices[0].delta.role, c.choices[0].delta.content) for c in chunks] == [
        ("assistant", " tok0"), (None, " tok1"), (None, "")
    ]


async def test_leaving_early_closes_the_connection(serve):
    server, url = await serve(stream_chunks=50, chunk_interval=0.01)
    async with AsyncClient(url) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        async with stream:
            async for chunk in stream:
                if chunk.choices[0].text == " tok1":
                    break
        await asyncio.wait_for(server.streams["p"].disconnected.wait(), timeout=5)
        connector = client._get_session().connector
        assert connector is not None and len(connector._acquired) == 0
    assert server.streams["p"].chunks_written < 50


async def test_drop_after_chunks_is_not_retried_silently(serve):
    server, url = await serve(script={"p": [("stream_drop", 2)]}, stream_chunks=4)
    async with AsyncClient(url, retry_policy=FAST) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        received = []
        with pytest.raises(StreamInterruptedError) as info:
            async with stream:
                async for chunk in stream:
                    received.append(chunk.choices[0].text)
    assert received == [" tok0", " tok1"]
    assert info.value.chunks_received == 2
    assert str(info.value).startswith("stream interrupted after 2 chunk(s): ")
    assert len(server.arrivals_for("p")) == 1


async def test_drop_before_any_chunk_is_reopened(serve):
    server, url = await serve(script={"p": [("stream_drop", 0)]}, stream_chunks=2)
    async with AsyncClient(url, retry_policy=FAST) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        async with stream:
            texts = [chunk.choices[0].text async for chunk in stream]
    assert texts == [" tok0", " tok1", ""]
    assert len(server.arrivals_for("p")) == 2


async def test_malformed_sse_line(serve):
    server, url = await serve(script={"p": [("bad_sse", 1)]}, stream_chunks=3)
    async with AsyncClient(url, retry_policy=FAST) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        with pytest.raises(APIResponseValidationError) as info:
            async with stream:
                async for _ in stream:
                    pass
    assert str(info.value) == "malformed SSE data: '{not json'"
    assert len(server.arrivals_for("p")) == 1


async def test_gap_between_chunks_times_out(serve):
    _, url = await serve(script={"p": [("stall", 1, 0.5)]}, stream_chunks=3)
    async with AsyncClient(url, retry_policy=FAST, timeout=Timeout(chunk=0.1)) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        with pytest.raises(StreamInterruptedError) as info:
            async with stream:
                async for _ in stream:
                    pass
    assert info.value.chunks_received == 1
    assert isinstance(info.value.__cause__, TimeoutError)


async def test_stall_before_first_chunk_is_retried_then_fails(serve):
    server, url = await serve(script={"p": [("stall", 0, 0.5)] * 3}, stream_chunks=2)
    async with AsyncClient(url, retry_policy=FAST, timeout=Timeout(chunk=0.1)) as client:
        stream = await client.completions.create(model="m", prompt="p", stream=True)
        with pytest.raises(APITimeoutError):
            async with stream:
                async for _ in stream:
                    pass
    assert len(server.arrivals_for("p")) == 3
