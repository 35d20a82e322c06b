"""A replica that answers at once, for measuring what the router itself costs.

A raw asyncio protocol on uvloop with its answers built once: it reads a request's head and
``Content-Length`` body and writes back either a small JSON completion or a stream of
``SSE_CHUNKS`` server-sent events (chunked transfer encoding, one write per event, as a
replica streams), with the load-hint headers a pagedserve replica sends. No HTTP framework
and no JSON parsing, so that a core of it serves far more requests per second than the router
in front of it: the router, not the backend, is what a run measures. Keep-alive throughout.

    python -m benchmarks.fake_backend PORT
"""

from __future__ import annotations

import asyncio
import sys

from pagedserve.common.load_hints import LoadHints

SSE_CHUNKS = 4
_HINTS = "".join(f"{name}: {value}\r\n" for name, value in LoadHints(
    kv_cache_usage=0.1, num_waiting=0, num_running=1, free_token_capacity=100_000,
    num_preemptions=0).to_headers().items())


def _json_answer() -> bytes:
    body = b'{"id":"cmpl-0","object":"text_completion","model":"fake","choices":' \
           b'[{"index":0,"text":" ok","finish_reason":"stop"}]}'
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{_HINTS}\r\n")
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _stream_parts() -> list[bytes]:
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            f"Transfer-Encoding: chunked\r\n{_HINTS}\r\n").encode()
    events = [b'data: {"id":"cmpl-0","object":"text_completion","choices":[{"index":0,'
              b'"text":" t%d","finish_reason":null}]}\n\n' % i for i in range(SSE_CHUNKS)]
    return [head + _chunk(events[0]), *(_chunk(e) for e in events[1:]),
            _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]


JSON_ANSWER = _json_answer()
STREAM_PARTS = _stream_parts()
_HEALTH = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n" \
          b'{"status":"ok"}'


class FakeReplica(asyncio.Protocol):
    """One connection: requests one after another (no pipelining needed by the router)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = next((int(line[15:]) for line in head.split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith(b"get"):
            self.transport.write(_HEALTH)
        elif b'"stream":true' in body.replace(b" ", b""):
            for part in STREAM_PARTS:
                self.transport.write(part)
        else:
            self.transport.write(JSON_ANSWER)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FakeReplica, "127.0.0.1", port, reuse_address=True)
    print(f"fake backend on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(port: int) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(port))
    else:
        uvloop.run(serve(port))


if __name__ == "__main__":
    main(int(sys.argv[1]))
