"""The resource objects: ``client.completions`` and ``client.chat.completions``.

``create`` takes the OpenAI request fields as keyword arguments; any field not named here
(``temperature``, ``n``, ``logprobs``, ``stop``, ``seed``, vLLM's extras, ...) passes through
``**params`` into the JSON body unchanged. Fields given as None are left out, so the server's
default applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from pagedserve.client.api.response_types import Response, ResponseStreamEvent
from pagedserve.client.api.streaming import Stream
from pagedserve.client.api.types import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    parse_response,
)

if TYPE_CHECKING:
    from pagedserve.client.api.client import AsyncClient, Timeout

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"

Prompt = str | list[str] | list[int] | list[list[int]]

ResponseT = TypeVar("ResponseT")
ChunkT = TypeVar("ChunkT")


class _Resource(Generic[ResponseT, ChunkT]):
    """One endpoint's POST, as a JSON answer or a ``Stream`` of chunks."""

    def __init__(
        self,
        client: AsyncClient,
        path: str,
        parse: Callable[[dict[str, Any], Mapping[str, str]], ResponseT],
        parse_chunk: Callable[[dict[str, Any]], ChunkT],
    ) -> None:
        self._client = client
        self._path = path
        self._parse = parse
        self._parse_chunk = parse_chunk

    async def _create(
        self,
        fields: Mapping[str, Any],
        stream: bool,
        timeout: Timeout | float | None,
        extra_headers: Mapping[str, str] | None,
    ) -> ResponseT | Stream[ChunkT]:
        body = {key: value for key, value in fields.items() if value is not None}
        if stream:
            body["stream"] = True
            return await self._client.open_stream(
                self._path, body, self._parse_chunk, timeout=timeout, extra_headers=extra_headers
            )
        response = await self._client.request_json(
            "POST", self._path, body, timeout=timeout, extra_headers=extra_headers
        )
        return parse_response(self._parse, response.data, response.headers)


class Completions(_Resource[Completion, CompletionChunk]):
    """``POST /v1/completions``."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client, COMPLETIONS_PATH, Completion.from_dict, CompletionChunk.from_dict)

    @overload
    async def create(
        self,
        *,
        model: str,
        prompt: Prompt,
        stream: Literal[False] = False,
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Completion: ...

    @overload
    async def create(
        self,
        *,
        model: str,
        prompt: Prompt,
        stream: Literal[True],
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Stream[CompletionChunk]: ...

    async def create(
        self,
        *,
        model: str,
        prompt: Prompt,
        stream: bool = False,
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Completion | Stream[CompletionChunk]:
        fields = {"model": model, "prompt": prompt, "max_tokens": max_tokens, **params}
        return await self._create(fields, stream, timeout, extra_headers)


class ChatCompletions(_Resource[ChatCompletion, ChatCompletionChunk]):
    """``POST /v1/chat/completions``."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(
            client, CHAT_COMPLETIONS_PATH, ChatCompletion.from_dict, ChatCompletionChunk.from_dict
        )

    @overload
    async def create(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        stream: Literal[False] = False,
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        stream: Literal[True],
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Stream[ChatCompletionChunk]: ...

    async def create(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        stream: bool = False,
        max_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        fields = {"model": model, "messages": messages, "max_tokens": max_tokens, **params}
        return await self._create(fields, stream, timeout, extra_headers)


class Chat:
    """``client.chat``: the namespace that holds ``completions``, as in the OpenAI SDK."""

    def __init__(self, client: AsyncClient) -> None:
        self.completions = ChatCompletions(client)


class Responses(_Resource[Response, ResponseStreamEvent]):
    """``POST /v1/responses``: a ``Response``, or a ``Stream`` of its typed events."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client, RESPONSES_PATH, Response.from_dict,
                         ResponseStreamEvent.from_dict)

    @overload
    async def create(
        self,
        *,
        model: str,
        input: str | list[dict[str, Any]],
        stream: Literal[False] = False,
        max_output_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Response: ...

    @overload
    async def create(
        self,
        *,
        model: str,
        input: str | list[dict[str, Any]],
        stream: Literal[True],
        max_output_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Stream[ResponseStreamEvent]: ...

    async def create(
        self,
        *,
        model: str,
        input: str | list[dict[str, Any]],
        stream: bool = False,
        max_output_tokens: int | None = None,
        timeout: Timeout | float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Response | Stream[ResponseStreamEvent]:
        fields = {"model": model, "input": input, "max_output_tokens": max_output_tokens,
                  **params}
        return await self._create(fields, stream, timeout, extra_headers)
