"""The streaming request function: chunk timestamps, usage, and every failure as a result."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from itertools import count

import aiohttp
import orjson
import pytest

from pagedserve.loadgen.bench_config import RequestSpec
from pagedserve.loadgen.datasets import SampleRequest
from pagedserve.loadgen.request import (
    RequestResult,
    StreamProtocolError,
    _read_stream,
    build_payload,
    send_request,
)

TIMEOUT = aiohttp.ClientTimeout(total=10)
HEADERS = {"Content-Type": "application/json"}
TOKEN = " hello"  # what the fake server streams per token


async def _send(url: str, endpoint: str = "completions", max_tokens: int = 4,
                **spec_kwargs: object) -> RequestResult:
    spec = RequestSpec(base_url=url, model="tiny", endpoint=endpoint, **spec_kwargs)
    body = orjson.dumps(build_payload(spec, SampleRequest(" the cat sat", 3, max_tokens)))
    result = RequestResult(request_id=0, prompt_len=3, max_tokens=max_tokens)
    async with aiohttp.ClientSession() as session:
        await send_request(session, spec.url, body, HEADERS, result, TIMEOUT)
    return result


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_stream_timestamps_every_text_chunk(serve, endpoint: str) -> None:
    server, url = serve()
    result = await _send(url, endpoint, max_tokens=5)
    assert result.success and result.error == ""
    # A chat stream's role-only first delta is not a token.
    assert len(result.chunk_times) == 5
    assert result.text == TOKEN * 5
    assert (result.output_tokens, result.output_tokens_source) == (5, "usage")
    assert result.usage_prompt_tokens == 3
    assert result.sent < result.chunk_times[0] <= result.chunk_times[-1] <= result.finished
    assert server.served[0].payload["stream_options"] == {"include_usage": True}


async def test_parallel_samples_are_all_collected(serve) -> None:
    server, url = serve()
    result = await _send(url, n=3, max_tokens=2)
    assert result.output_tokens == 6 and result.text == TOKEN * 6
    assert server.served[0].payload["n"] == 3
    assert server.served[0].payload["temperature"] == 1.0


@pytest.mark.parametrize(("fault", "error"), [
    ("http500", "HTTP 500: injected failure"),
    ("malformed", "SSEDecodeError: malformed SSE data: '{\"choices\": [{\"text\": '"),
    ("error_event", "StreamProtocolError: error event in stream: injected stream error"),
    ("no_done", "StreamProtocolError: stream ended before 'data: [DONE]'"),
])
async def test_faults_become_failed_results(serve, fault: str, error: str) -> None:
    _, url = serve(faults={0: fault})
    result = await _send(url)
    assert not result.success
    assert result.error == error
    assert result.finished >= result.sent


async def test_dropped_connection_is_a_failed_result(serve) -> None:
    _, url = serve(faults={0: "drop"})
    result = await _send(url)
    assert not result.success
    assert result.error.startswith("ClientPayloadError: Response payload is not completed")
    assert len(result.chunk_times) == 1  # the token sent before the drop was seen


async def test_refused_connection_is_a_failed_result() -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await _send(f"http://127.0.0.1:{port}")
    assert not result.success and result.error.startswith("ClientConnectorError: ")


def test_payload_carries_sampling_options() -> None:
    spec = RequestSpec(base_url="http://h:1/", model="m", endpoint="chat", n=2, best_of=4,
                       use_beam_search=True, ignore_eos=True, extra_body={"seed": 5})
    payload = build_payload(spec, SampleRequest("hi", 1, 9))
    # Beam search picks its answer at the end: the request is not streamed.
    assert payload == {
        "model": "m", "max_tokens": 9, "temperature": 0.0, "stream": False,
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2, "best_of": 4, "use_beam_search": True, "ignore_eos": True, "seed": 5,
    }
    assert spec.url == "http://h:1/v1/chat/completions"
    sampled = RequestSpec(base_url="http://h:1/v1", model="m", top_p=0.9, top_k=20, min_p=0.05,
                          logprobs=3, temperature=0.7)
    assert build_payload(sampled, SampleRequest("hi", 1, 9)) == {
        "model": "m", "max_tokens": 9, "temperature": 0.7, "stream": True,
        "stream_options": {"include_usage": True}, "prompt": "hi",
        "top_p": 0.9, "top_k": 20, "min_p": 0.05, "logprobs": 3,
    }
    assert sampled.url == "http://h:1/v1/completions"  # no /v1/v1
    chat = RequestSpec(base_url="http://h:1", model="m", endpoint="chat", logprobs=2)
    payload = build_payload(chat, SampleRequest("hi", 1, 9))
    assert (payload["logprobs"], payload["top_logprobs"]) == (True, 2)


class _StubContent:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter([*reads, b""])

    async def readany(self) -> bytes:
        return next(self._reads)


class _StubResponse:
    def __init__(self, reads: list[bytes]) -> None:
        self.content = _StubContent(reads)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    ticks = count(start=100.0, step=1.0)
    monkeypatch.setattr("pagedserve.loadgen.request.time.perf_counter", lambda: next(ticks))
    yield


async def test_events_split_across_reads_keep_their_read_time(fake_clock: None) -> None:
    a = b'data: {"choices": [{"text": "a"}]}\n\n'
    b = b'data: {"choices": [{"text": "b"}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
    # Read 1 (t=100) ends mid-event; read 2 (t=101) completes it and brings two more events;
    # read 3 (t=102) is the [DONE].
    reads = [a[:20], a[20:] + b + b'data: {"choices": [{"text": "c"}]}\n\n' + usage,
             b"data: [DONE]\n\n"]
    result = RequestResult(0, 1, 3)
    parts: list[str] = []
    await _read_stream(_StubResponse(reads), result, parts)
    assert result.chunk_times == [101.0, 101.0, 101.0]
    assert result.finished == 102.0
    assert "".join(parts) == "abc" and result.output_tokens == 3


async def test_done_without_any_choice_is_an_error(fake_clock: None) -> None:
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 0}}\n\n'
    with pytest.raises(StreamProtocolError, match="without any choices"):
        await _read_stream(_StubResponse([usage, b"data: [DONE]\n\n"]),
                           RequestResult(0, 1, 1), [])


@pytest.mark.parametrize("chat", [False, True])
async def test_tokens_without_text_complete_the_request(fake_clock: None, chat: bool) -> None:
    # Every sampled token decodes to "" (ids the tokenizer has no text for).
    def chunk(i: int, finish: str | None = None) -> bytes:
        choice: dict = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {"role": "assistant", "content": ""} if i == 0 else {"content": ""}
        else:
            choice["text"] = ""
        return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"

    role = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    reads = [role] if chat else []  # t=100: a role announcement carries no token
    reads += [chunk(1), chunk(2), chunk(3, "length"),
              b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n',
              b"data: [DONE]\n\n"]
    result = RequestResult(0, 1, 3)
    parts: list[str] = []
    await _read_stream(_StubResponse(reads), result, parts)
    first = 101.0 if chat else 100.0
    # Empty text beside the finish reason is the end of the stream, not a token.
    assert result.chunk_times == [first, first + 1]
    assert parts == [] and result.output_tokens == 3


async def test_a_stream_whose_choices_never_carry_a_token_times_its_first_choice(
        fake_clock: None) -> None:
    role = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}'
    finish = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}'
    result = RequestResult(0, 1, 1)
    await _read_stream(_StubResponse([role + b"\n\n", finish + b"\n\n",
                                      b"data: [DONE]\n\n"]), result, [])
    assert result.chunk_times == [100.0]  # as vLLM's client counts it


async def test_choices_of_the_wrong_shape_are_an_error(fake_clock: None) -> None:
    with pytest.raises(StreamProtocolError, match="'choices' is not a list"):
        await _read_stream(_StubResponse([b'data: {"choices": "x"}\n\n']),
                           RequestResult(0, 1, 1), [])
