"""The resource objects: ``client.completions`` and ``client.chat.completions``.

``create`` takes the OpenAI request fields as keyword arguments; any field not named here
(``temperature``, ``n``, ``logprobs``, ``stop``, ``seed``, vLLM's extras, ...) passes through
``**params`` into the JSON body unchanged. Fields given as None are left out, so the server's
default applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from pagedserve.client.streaming import Stream
from pagedserve.client.types import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    parse_response,
)

if TYPE_CHECKING:
    from pagedserve.client.client import AsyncClient, Timeout

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

Prompt = str | list[str] | list[int] | list[list[int]]


def _body(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


class Completions:
    """``POST /v1/completions``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

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
        body = _body({"model": model, "prompt": prompt, "max_tokens": max_tokens, **params})
        if stream:
            body["stream"] = True
            return await self._client.open_stream(
                COMPLETIONS_PATH,
                body,
                CompletionChunk.from_dict,
                timeout=timeout,
                extra_headers=extra_headers,
            )
        response = await self._client.request_json(
            "POST", COMPLETIONS_PATH, body, timeout=timeout, extra_headers=extra_headers
        )
        return parse_response(Completion.from_dict, response.data, response.headers)


class ChatCompletions:
    """``POST /v1/chat/completions``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

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
        body = _body({"model": model, "messages": messages, "max_tokens": max_tokens, **params})
        if stream:
            body["stream"] = True
            return await self._client.open_stream(
                CHAT_COMPLETIONS_PATH,
                body,
                ChatCompletionChunk.from_dict,
                timeout=timeout,
                extra_headers=extra_headers,
            )
        response = await self._client.request_json(
            "POST", CHAT_COMPLETIONS_PATH, body, timeout=timeout, extra_headers=extra_headers
        )
        return parse_response(ChatCompletion.from_dict, response.data, response.headers)


class Chat:
    """``client.chat``: the namespace that holds ``completions``, as in the OpenAI SDK."""

    def __init__(self, client: AsyncClient) -> None:
        self.completions = ChatCompletions(client)
