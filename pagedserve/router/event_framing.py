"""Server-sent events as the router relays them: whole events only, and how a stream ended.

A replica's chunks need not end where its events do. The router passes on only whole events
(a chunk's unfinished tail waits for the rest), so whatever ends a stream, the error event
the router may add parses on its own. The stream said it was complete when its last event is
``data: [DONE]``, a chunk with a finish reason, the usage chunk or an error, or a terminal
event of the Responses API, whose streams have no ``[DONE]``; comments (``: keep-alive``) do
not count.
"""

from __future__ import annotations

import orjson

# The Responses API's last events: its stream ends after one of them.
TERMINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed",
                            "error"})
# No event is this long; a replica that sends more without a blank line is not streaming SSE.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class NotEventStream(Exception):
    """The bytes are not server-sent events."""


class EventFraming:
    """Splits a byte stream into whole events; remembers the last block of them."""

    __slots__ = ("_last", "_partial")

    def __init__(self) -> None:
        self._partial = b""
        self._last = b""  # the latest chunk of whole events that held more than comments

    def whole(self, chunk: bytes) -> bytes:
        """The whole events ``chunk`` completes (with what came before it); holds its tail.
        A chunk that ends where an event does (the usual case) is returned as is."""
        if not self._partial and chunk.endswith(b"\n\n") and not chunk.startswith(b":"):
            self._last = chunk  # the usual case, first and at the least cost
            return chunk
        data = self._partial + chunk if self._partial else chunk
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if not end:
            if len(data) > MAX_EVENT_BYTES:
                raise NotEventStream(f"{len(data)} bytes without the blank line that ends "
                                     f"an event")
            self._partial = data
            return b""
        events = data if end == len(data) else data[:end]
        self._partial = data[end:]
        if not (events.startswith(b":") and only_comments(events)):
            self._last = events
        return events

    def complete(self) -> bool:
        """Whether the stream so far ends with an event that says it is complete."""
        if self._partial.strip():
            return False  # cut inside an event
        event = _last_event(self._last)
        return event is not None and _says_done(*event)


def only_comments(events: bytes) -> bool:
    return all(not line or line.startswith(b":") for line in events.splitlines())


def _last_event(events: bytes) -> tuple[bytes | None, bytes] | None:
    """The ``event:`` name and ``data:`` of the last event of a block that is not comments."""
    blocks = events.replace(b"\r\n", b"\n").rstrip(b"\n").split(b"\n\n")
    for block in reversed(blocks):
        name, data = None, []
        for line in block.split(b"\n"):
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value
        if data:
            return name, b"\n".join(data)
    return None


def _says_done(name: bytes | None, data: bytes) -> bool:
    if data == b"[DONE]":
        return True
    if name is not None and name.decode(errors="replace") in TERMINAL_TYPES:
        return True
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(payload, dict):
        return False
    if "error" in payload or payload.get("type") in TERMINAL_TYPES:
        return True
    choices = payload.get("choices")
    if choices == [] and payload.get("usage") is not None:
        return True  # the usage chunk (stream_options.include_usage) follows every finish
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)
