"""Server-Sent Events as OpenAI-compatible servers send them: ``data: {json}`` lines.

The decoder is fed raw lines (bytes, newline included or not) and yields complete events;
``[DONE]`` ends the stream. Shared by the client and the load generator so both read a
stream the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

DONE = "[DONE]"


class SSEDecodeError(ValueError):
    """A ``data:`` payload that is not valid JSON."""


@dataclass(slots=True)
class ServerSentEvent:
    data: str
    event: str | None = None

    @property
    def is_done(self) -> bool:
        return self.data == DONE

    def json(self) -> dict:
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError as exc:
            raise SSEDecodeError(f"malformed SSE data: {self.data[:200]!r}") from exc


class SSEDecoder:
    """Accumulates ``field: value`` lines; a blank line dispatches the event."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None

    def feed_line(self, raw: bytes | str) -> ServerSentEvent | None:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> ServerSentEvent | None:
        """The event left when the stream ends without a trailing blank line."""
        return self._dispatch()

    def _dispatch(self) -> ServerSentEvent | None:
        if not self._data:
            self._event = None
            return None
        event = ServerSentEvent(data="\n".join(self._data), event=self._event)
        self._data, self._event = [], None
        return event


async def iter_sse(lines: AsyncIterator[bytes]) -> AsyncIterator[ServerSentEvent]:
    """Events from an async iterator of lines (e.g. ``aiohttp`` ``response.content``)."""
    decoder = SSEDecoder()
    async for raw in lines:
        event = decoder.feed_line(raw)
        if event is not None:
            yield event
            if event.is_done:
                return
    event = decoder.flush()
    if event is not None:
        yield event
