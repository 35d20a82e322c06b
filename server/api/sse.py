"""Server-Sent Events as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``.

Once the 200 and its headers are out, an error can no longer change the status, so it goes
to the client as one more event, ``data: {"error": {...}}``, followed by ``[DONE]`` so that
readers end cleanly instead of seeing a dropped connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.api.errors import from_exception

DONE_EVENT = b"data: [DONE]\n\n"


def encode_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def stream_events(request: web.Request,
                        chunks: AsyncIterator[list[dict[str, Any]]]) -> web.StreamResponse:
    """Sends each list of chunks the iterator yields as one write (one step's worth)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for batch in chunks:
            if batch:
                await response.write(b"".join(encode_event(chunk) for chunk in batch))
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone; the caller's cleanup aborts the engine requests
    except Exception as exc:
        await response.write(encode_event(from_exception(exc, request).body()))
    await response.write(DONE_EVENT)
    await response.write_eof()
    return response
