"""One request, timestamped chunk by chunk when it streams.

Each read from the socket buffer is stamped with ``time.perf_counter()`` the moment it
returns, before any parsing; every event decoded from that read shares the stamp, since its
bytes arrived together. A chunk counts as a token arrival when a choice carries a token: a
completion's ``text`` or a chat delta's ``content``, even an empty one (a token the tokenizer
has no text for decodes to ""), or logprobs. A chat delta that only announces the role, a
choice that only carries the finish reason, and usage-only chunks are not tokens. A stream
whose choices never carried a token still completed; its first chunk with choices stands for
the first token, as in vLLM's benchmark client.

Requests for ``best_of`` candidates or beam search are sent unstreamed (the winner is known
only at the end); they have no TTFT or inter-token times, only end-to-end latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from pagedserve.client.api.sse import ServerSentEvent, SSEDecodeError, SSEDecoder
from pagedserve.loadgen.bench_config import RequestSpec
from pagedserve.loadgen.datasets import SampleRequest

_ERROR_BODY_LIMIT = 300


class StreamProtocolError(Exception):
    """A stream that is valid SSE but not a valid OpenAI completion stream."""


@dataclass(slots=True)
class RequestResult:
    """What happened to one request; times are ``perf_counter`` seconds."""

    request_id: int
    prompt_len: int
    max_tokens: int
    scheduled: float = 0.0  # when the arrival schedule made it due
    started: float = 0.0  # when its coroutine ran (before any wait for a concurrency slot)
    sent: float = 0.0  # just before the HTTP request went out
    finished: float = 0.0  # the stream's [DONE], or the moment it failed
    chunk_times: list[float] = field(default_factory=list)
    success: bool = False
    error: str = ""
    output_tokens: int | None = None
    output_tokens_source: str = ""  # "usage" (the server's count) or "tokenizer"
    usage_prompt_tokens: int | None = None
    text: str = ""
    streamed: bool = True

    @property
    def ttft(self) -> float | None:
        """None for an unstreamed request (or one that failed before its first token)."""
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2el(self) -> float:
        return self.finished - self.sent


def build_payload(spec: RequestSpec, sample: SampleRequest) -> dict[str, object]:
    """The JSON body for one sample: streamed with usage (unless best_of or beam search),
    sampling options and vLLM's extensions where set."""
    payload: dict[str, object] = {
        "model": spec.model,
        "max_tokens": sample.expected_output_len,
        "temperature": spec.effective_temperature,
        "stream": spec.streams,
    }
    if spec.streams:
        payload["stream_options"] = {"include_usage": True}
    if spec.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": sample.prompt}]
    else:
        payload["prompt"] = sample.prompt
    for name in ("top_p", "top_k", "min_p"):
        if getattr(spec, name) is not None:
            payload[name] = getattr(spec, name)
    if spec.logprobs is not None:
        if spec.endpoint == "chat":
            payload.update(logprobs=True, top_logprobs=spec.logprobs)
        else:
            payload["logprobs"] = spec.logprobs
    if spec.n != 1:
        payload["n"] = spec.n
    if spec.best_of is not None:
        payload["best_of"] = spec.best_of
    if spec.use_beam_search:
        payload["use_beam_search"] = True
    if spec.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(spec.extra_body)
    return payload


async def send_request(session: aiohttp.ClientSession, url: str, body: bytes,
                       headers: dict[str, str], result: RequestResult,
                       timeout: aiohttp.ClientTimeout, stream: bool = True) -> None:
    """Posts ``body`` and reads the answer (a stream, or one JSON body when ``stream`` is
    False) into ``result``; never raises for a failure."""
    parts: list[str] = []
    result.streamed = stream
    result.sent = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as response:
            if response.status != 200:
                result.error = await _http_error(response)
            elif stream:
                await _read_stream(response, result, parts)
            else:
                await _read_json(response, result, parts)
    except TimeoutError:
        result.error = f"timeout: no complete response within {timeout.total} s"
    except (aiohttp.ClientError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    except (SSEDecodeError, StreamProtocolError, UnicodeDecodeError,
            orjson.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if not result.finished:
        result.finished = time.perf_counter()
    result.text = "".join(parts)
    result.success = not result.error


async def _http_error(response: aiohttp.ClientResponse) -> str:
    body = await response.content.read(_ERROR_BODY_LIMIT * 4)
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    return f"HTTP {response.status}: {str(message)[:_ERROR_BODY_LIMIT]}"


async def _read_json(response: aiohttp.ClientResponse, result: RequestResult,
                     parts: list[str]) -> None:
    """An unstreamed answer: its choices' text and its usage; no token times."""
    answer = orjson.loads(await response.read())
    result.finished = time.perf_counter()
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise StreamProtocolError(f"response has no 'choices' list: {answer!r:.200}")
    for choice in answer["choices"]:
        if not isinstance(choice, dict):
            raise StreamProtocolError(f"a choice is not an object: {choice!r:.200}")
        message = choice.get("message")
        piece = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(piece, str):
            parts.append(piece)
    usage = answer.get("usage")
    if isinstance(usage, dict):
        _apply_usage(usage, result)


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult,
                       parts: list[str]) -> None:
    decoder = SSEDecoder()
    tail = b""
    done = False
    first_choices: list[float] = []  # when the first chunk with choices arrived
    while True:
        data = await response.content.readany()
        now = time.perf_counter()
        if not data:
            break
        if done:
            continue  # drain to the end of the body so the connection can be reused
        *lines, tail = (tail + data).split(b"\n")
        for line in lines:
            event = decoder.feed_line(line)
            if event is not None and not done:
                done = _handle(event, now, result, parts, first_choices)
    if not done:
        _finish_without_done(decoder, tail, result, parts, first_choices)
    if not result.chunk_times:
        if not first_choices:
            raise StreamProtocolError("stream completed without any choices, so TTFT "
                                      "is undefined")
        result.chunk_times.append(first_choices[0])


def _finish_without_done(decoder: SSEDecoder, tail: bytes, result: RequestResult,
                         parts: list[str], first_choices: list[float]) -> None:
    now = time.perf_counter()
    for event in (decoder.feed_line(tail) if tail else None, decoder.flush()):
        if event is not None and _handle(event, now, result, parts, first_choices):
            return
    raise StreamProtocolError("stream ended before 'data: [DONE]'")


def _handle(event: ServerSentEvent, now: float, result: RequestResult,
            parts: list[str], first_choices: list[float]) -> bool:
    """Applies one event; True at ``[DONE]``."""
    if event.is_done:
        result.finished = now
        return True
    chunk = event.json()
    if not isinstance(chunk, dict):
        raise StreamProtocolError(f"chunk is not a JSON object: {event.data[:200]!r}")
    if "error" in chunk:
        raise StreamProtocolError(f"error event in stream: {_error_message(chunk['error'])}")
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        _apply_usage(usage, result)
    choices = chunk.get("choices")
    if choices:
        if not first_choices:
            first_choices.append(now)
        if _append_tokens(choices, parts):
            result.chunk_times.append(now)
    return False


def _append_tokens(choices: object, parts: list[str]) -> bool:
    """Appends the choices' text; True when any choice carries a token."""
    if not isinstance(choices, list):
        raise StreamProtocolError(f"'choices' is not a list: {choices!r:.200}")
    got_token = False
    for choice in choices:
        if not isinstance(choice, dict):
            raise StreamProtocolError(f"a choice is not an object: {choice!r:.200}")
        piece, is_token = _choice_piece(choice)
        if piece:
            parts.append(piece)
        got_token |= is_token
    return got_token


def _choice_piece(choice: dict) -> tuple[str, bool]:
    """(text, whether the choice carries a token)."""
    finishing = choice.get("finish_reason") is not None
    has_logprobs = bool(choice.get("logprobs"))
    delta = choice.get("delta")
    if isinstance(delta, dict):
        piece = delta.get("content")
        reasoning = delta.get("reasoning_content")
        if not piece and isinstance(reasoning, str) and reasoning:
            piece = reasoning
        if not isinstance(piece, str):
            return "", has_logprobs
        # An empty content beside the role is the role announcement, not a token.
        silent = not piece and ("role" in delta or finishing)
        return piece, has_logprobs or not silent
    piece = choice.get("text")
    if not isinstance(piece, str):
        return "", has_logprobs
    return piece, has_logprobs or bool(piece) or not finishing


def _apply_usage(usage: dict, result: RequestResult) -> None:
    completion = usage.get("completion_tokens")
    if isinstance(completion, int):
        result.output_tokens = completion
        result.output_tokens_source = "usage"
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int):
        result.usage_prompt_tokens = prompt


def _error_message(error: object) -> str:
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])[:_ERROR_BODY_LIMIT]
    return str(error)[:_ERROR_BODY_LIMIT]
