"""A replica written at the socket, for faults aiohttp's server would not commit: a reset, a
stream framed by closing the connection and cut short, an empty event stream.

``/health`` and ``/load`` answer 200; every other request gets its ``fault``'s bytes, after
which the connection is closed (or reset).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import orjson

from tests.router.fake_replica import IDLE, event

STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Connection: close\r\n\r\n")
FIRST_EVENT = event({"replica": "raw", "chunk": 1})


async def reset(writer: asyncio.StreamWriter) -> None:
    """A TCP reset before any byte of an answer."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def reset_after_first_event(writer: asyncio.StreamWriter) -> None:
    """A chunked stream (so that its end is not the connection's) reset after one event."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n"
                 + b"%x\r\n%s\r\n" % (len(FIRST_EVENT), FIRST_EVENT))
    await writer.drain()
    await asyncio.sleep(0.05)
    await reset(writer)


async def truncated(writer: asyncio.StreamWriter) -> None:
    """A close-framed stream (no length, not chunked) that ends without ``[DONE]``."""
    writer.write(STREAM_HEAD + FIRST_EVENT)
    await writer.drain()
    writer.close()


async def empty_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Content-Length: 0\r\n\r\n")
    await writer.drain()
    writer.close()


class RawReplica:
    def __init__(self, fault: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.fault = fault
        self.requests = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> RawReplica:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                length = _content_length(head)
                if length:
                    await reader.readexactly(length)
                if path in (b"/health", b"/load"):
                    body = orjson.dumps({"status": "ok"} if path == b"/health"
                                        else IDLE.to_json())
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                self.requests += 1
                await self.fault(writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
