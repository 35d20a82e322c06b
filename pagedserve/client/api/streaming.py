"""A streamed answer: ``async for`` over typed chunks, ``async with`` to close it.

Leaving early (``break``, an exception, leaving the ``async with``) closes the connection
rather than returning it to the pool, so the server sees the disconnect and stops generating.
A connection that breaks before any chunk reached the caller is reopened under the client's
retry policy; one that breaks later raises ``StreamInterruptedError``, because a transparent
retry would hand the caller a second, different beginning.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from types import TracebackType
from typing import Any, Generic, TypeVar

import aiohttp

from pagedserve.client.api.client_errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStreamError,
    StreamInterruptedError,
    transport_error,
)
from pagedserve.client.api.sse import ServerSentEvent, SSEDecodeError, iter_sse

ChunkT = TypeVar("ChunkT")

# Given the error that broke the stream, wait as the retry policy says and send the request
# again; raises that error (or the new one) when no retry is left.
Reopen = Callable[[APIConnectionError], Awaitable[aiohttp.ClientResponse]]


class Stream(Generic[ChunkT]):
    def __init__(
        self,
        response: aiohttp.ClientResponse,
        parse: Callable[[dict[str, Any]], ChunkT],
        reopen: Reopen,
    ) -> None:
        self._response = response
        self._parse = parse
        self._reopen = reopen
        self._chunks_received = 0
        self._iterator: AsyncGenerator[ChunkT, None] | None = None
        self._closed = False

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers of the response being read (load hints included)."""
        return self._response.headers

    @property
    def chunks_received(self) -> int:
        return self._chunks_received

    def __aiter__(self) -> Stream[ChunkT]:
        return self

    async def __anext__(self) -> ChunkT:
        if self._iterator is None:
            self._iterator = self._iterate()
        try:
            return await self._iterator.__anext__()
        except BaseException:
            # Finished, failed or cancelled: either way the connection is no longer wanted.
            await self.close()
            raise

    async def __aenter__(self) -> Stream[ChunkT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; idempotent. A fully read stream returns it to the pool."""
        if self._closed:
            return
        self._closed = True
        if self._iterator is not None:
            await self._iterator.aclose()
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()

    async def _iterate(self) -> AsyncGenerator[ChunkT, None]:
        while True:
            try:
                async with aclosing(self._read(self._response)) as chunks:
                    async for chunk in chunks:
                        self._chunks_received += 1
                        yield chunk
                return
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = transport_error(exc, str(self._response.url))
                self._response.close()
                if self._chunks_received:
                    raise StreamInterruptedError(
                        self._chunks_received, exc, url=error.url
                    ) from exc
                self._response = await self._reopen(error)

    async def _read(self, response: aiohttp.ClientResponse) -> AsyncIterator[ChunkT]:
        async with aclosing(iter_sse(response.content)) as events:
            async for event in events:
                if event.is_done:
                    return
                yield self._decode(event, str(response.url))

    def _decode(self, event: ServerSentEvent, url: str) -> ChunkT:
        try:
            data = event.json()
        except SSEDecodeError as exc:
            raise APIResponseValidationError(str(exc), url=url) from exc
        if not isinstance(data, dict):
            raise APIResponseValidationError(
                f"SSE data is not a JSON object: {event.data[:200]!r}", url=url
            )
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise APIStreamError(str(message), url=url, body=data)
        try:
            return self._parse(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise APIResponseValidationError(
                f"malformed stream chunk: {exc!r}", url=url, body=data
            ) from exc
