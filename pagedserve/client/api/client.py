"""``AsyncClient``: one aiohttp session against one OpenAI-compatible server.

``base_url`` is the server root, with or without a trailing ``/v1`` (so OpenAI's
``https://api.openai.com/v1`` works as given): the OpenAI routes live under ``/v1``,
pagedserve's ``/tokenize``, ``/load`` and ``/health`` at the root, as in vLLM. Left out,
``base_url`` and ``api_key`` come from ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, as with
the OpenAI SDK's ``AsyncOpenAI()``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import orjson
from yarl import URL

from pagedserve.client.api.client_errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    NotFoundError,
    decode_error_body,
    make_status_error,
    transport_error,
)
from pagedserve.client.api.models import Models
from pagedserve.client.api.resources import Chat, Completions, Responses
from pagedserve.client.api.retry import RetryPolicy, is_retryable
from pagedserve.client.api.streaming import Stream
from pagedserve.client.api.types import ServerLoad, TokenizeResult, parse_response
from pagedserve.common import otel

T = TypeVar("T")
ChunkT = TypeVar("ChunkT")


@dataclass(slots=True, frozen=True)
class Timeout:
    """Seconds allowed to ``connect``, for a whole non-streamed request (``total``), and
    between two reads of a stream (``chunk``, which also bounds a stream's first byte).
    None means no limit."""

    connect: float | None = 10.0
    total: float | None = 600.0
    chunk: float | None = 120.0

    def __post_init__(self) -> None:
        for name in ("connect", "total", "chunk"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"timeout {name} must be positive or None, got {value!r}")

    @classmethod
    def coerce(cls, value: Timeout | float | None, default: Timeout) -> Timeout:
        """A ``Timeout`` from a number (the total), None (``default``) or a ``Timeout``."""
        if value is None:
            return default
        if isinstance(value, Timeout):
            return value
        return cls(connect=default.connect, total=float(value), chunk=default.chunk)


@dataclass(slots=True, frozen=True)
class JSONResponse:
    data: Any
    headers: Mapping[str, str]


def normalize_base_url(base_url: str) -> URL:
    """The server root for ``base_url``; rejects anything that is not an http(s) URL."""
    url = URL(base_url.strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http(s) URL with a host, got {base_url!r}")
    path = url.path.rstrip("/")
    path = path.removesuffix("/v1")
    return url.with_path(path or "/").with_query(None).with_fragment(None)


class _RetryState:
    """Retries spent so far by one logical request (a stream reopen included)."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.retries = 0

    async def before_retry(self, error: APIStatusError | APIConnectionError) -> None:
        """Sleep as the policy says, or raise ``error`` when it must not be retried."""
        if not is_retryable(error) or self.retries >= self.policy.max_retries:
            raise error
        delay = self.policy.delay(self.retries, error)
        self.retries += 1
        await asyncio.sleep(delay)


BASE_URL_ENV = "OPENAI_BASE_URL"
API_KEY_ENV = "OPENAI_API_KEY"


class AsyncClient:
    """``client.completions.create(...)``, ``client.chat.completions.create(...)``,
    ``client.models.list()`` and ``client.models.retrieve(name)``.

    ``base_url`` defaults to ``$OPENAI_BASE_URL`` and ``api_key`` to ``$OPENAI_API_KEY``
    (pass ``api_key=""`` to send none even when the variable is set).

    Requests retry under ``retry_policy`` (by default ``max_retries`` retries with backoff and
    jitter, honouring ``Retry-After``). ``max_connections`` sizes the connection pool: no more
    requests than that are on the wire at once.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: Timeout | float | None = None,
        max_retries: int = 2,
        retry_policy: RetryPolicy | None = None,
        max_connections: int = 256,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if base_url is None:
            base_url = os.environ.get(BASE_URL_ENV)
            if not base_url:
                raise ValueError(
                    f"no base_url given and ${BASE_URL_ENV} is not set; pass the server's URL, "
                    "e.g. AsyncClient('http://127.0.0.1:8000/v1')"
                )
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV)
        self.root_url = normalize_base_url(base_url)
        self.timeout = Timeout.coerce(timeout, Timeout())
        self.retry_policy = retry_policy or RetryPolicy(max_retries=max_retries)
        self.max_connections = max_connections
        self._headers = {"Content-Type": "application/json", **(default_headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self.completions = Completions(self)
        self.chat = Chat(self)
        self.responses = Responses(self)
        self.models = Models(self)

    @property
    def base_url(self) -> str:
        return str(self.root_url).rstrip("/")

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use: aiohttp sessions belong to the loop that is running them.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    def url(self, path: str) -> str:
        return str(self.root_url.joinpath(path.lstrip("/")))

    async def request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> JSONResponse:
        """Send, retrying as the policy allows, and decode the JSON answer."""
        url = self.url(path)
        limits = Timeout.coerce(timeout, self.timeout)
        client_timeout = aiohttp.ClientTimeout(total=limits.total, connect=limits.connect)

        async def attempt() -> JSONResponse:
            response = await self._send(method, url, body, client_timeout, extra_headers)
            try:
                raw = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise transport_error(exc, url) from exc
            finally:
                response.release()
            try:
                return JSONResponse(orjson.loads(raw), response.headers)
            except orjson.JSONDecodeError as exc:
                raise APIResponseValidationError(
                    f"response is not JSON: {raw[:200]!r}", url=url
                ) from exc

        return await self._with_retries(attempt, _RetryState(self.retry_policy))

    async def open_stream(
        self,
        path: str,
        body: Any,
        parse: Callable[[dict[str, Any]], ChunkT],
        *,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Stream[ChunkT]:
        """POST ``body`` and return the SSE answer as a ``Stream`` once its headers arrive."""
        url = self.url(path)
        limits = Timeout.coerce(timeout, self.timeout)
        client_timeout = aiohttp.ClientTimeout(
            total=None, connect=limits.connect, sock_read=limits.chunk
        )
        state = _RetryState(self.retry_policy)

        async def attempt() -> aiohttp.ClientResponse:
            return await self._send("POST", url, body, client_timeout, extra_headers)

        async def reopen(error: APIConnectionError) -> aiohttp.ClientResponse:
            await state.before_retry(error)
            return await self._with_retries(attempt, state)

        response = await self._with_retries(attempt, state)
        return Stream(response, parse, reopen)

    async def _with_retries(self, attempt: Callable[[], Awaitable[T]], state: _RetryState) -> T:
        while True:
            try:
                return await attempt()
            except (APIStatusError, APIConnectionError) as error:
                await state.before_retry(error)

    async def _send(
        self,
        method: str,
        url: str,
        body: Any,
        timeout: aiohttp.ClientTimeout,
        extra_headers: Mapping[str, str] | None,
    ) -> aiohttp.ClientResponse:
        """One attempt; a 4xx/5xx answer becomes its ``APIStatusError``."""
        data = None if body is None else orjson.dumps(body)
        headers = dict(extra_headers or {})
        try:
            # The span ends when the answer's headers arrive; its context travels as
            # ``traceparent`` (both no-ops unless the application set up OpenTelemetry).
            with otel.client_span(f"{method} {URL(url).path}", {"http.request.method": method,
                                                                 "url.full": url}):
                otel.inject(headers)
                response = await self._get_session().request(
                    method, url, data=data, headers=headers, timeout=timeout
                )
            if response.status < 400:
                return response
            try:
                raw = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise transport_error(exc, url) from exc
        raise make_status_error(response.status, decode_error_body(raw), response.headers, url)

    async def tokenize(
        self,
        model: str,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
    ) -> TokenizeResult:
        """Exact token count from a pagedserve (or vLLM) server's ``POST /tokenize``."""
        if (prompt is None) == (messages is None):
            raise ValueError("tokenize needs exactly one of prompt or messages")
        body: dict[str, Any] = {"model": model}
        body.update({"prompt": prompt} if prompt is not None else {"messages": messages})
        response = await self.request_json("POST", "/tokenize", body)
        return parse_response(TokenizeResult.from_dict, response.data)

    async def load(self) -> ServerLoad | None:
        """pagedserve's ``GET /load``; None when the server has no such route."""
        try:
            response = await self.request_json("GET", "/load")
        except NotFoundError:
            return None
        return parse_response(ServerLoad.from_dict, response.data)
