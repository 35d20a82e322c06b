"""The engine requests behind one HTTP request, merged into one stream of outputs.

A completions request with several prompts becomes several engine requests; their outputs
arrive interleaved, each tagged with its prompt's index. Leaving the ``async with`` block
for any reason (done, error, the client went away and aiohttp cancelled the handler)
aborts every request still running, so their KV blocks are freed at once. ``interrupt``
lets the server end a batch from outside (graceful shutdown past its timeout).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from pagedserve.common.engine_errors import RequestFailedError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.telemetry.metrics import ServerMetrics
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.request_preparation import EngineRequest

if TYPE_CHECKING:
    from pagedserve.server.api.telemetry.tracing import ServerTracing
    from pagedserve.server.engine.async_engine import AsyncEngine, RequestStream

_Item = tuple[int, RequestOutput | BaseException]
# One engine request: its id, its prompt's token ids and text (None: ids only).
Prompt = tuple[str, list[int], str | None]


class GenerationBatch:
    def __init__(self, engine: AsyncEngine, active: set[GenerationBatch],
                 metrics: ServerMetrics, tracing: ServerTracing | None = None,
                 model: str = "", tenant: str | None = None) -> None:
        self._engine = engine
        self._tenant = tenant
        self._active = active
        self._metrics = metrics
        self._tracing = tracing
        self._model = model
        self._streams: list[RequestStream] = []
        self._unfinished: set[str] = set()
        self._last_token_time: list[float | None] = []
        self._params: list[SamplingParams] = []
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()

    async def __aenter__(self) -> GenerationBatch:
        self._active.add(self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._active.discard(self)
        self._abort_unfinished()

    async def submit(self, params: SamplingParams, prompts: Sequence[Prompt]) -> None:
        """Hands the engine one request per prompt through its door
        (``AsyncEngine.generate``); raises the engine's errors, and then none was added."""
        requests = [EngineRequest(request_id, token_ids, params, prompt=text,
                                  tenant=self._tenant)
                    for request_id, token_ids, text in prompts]
        for request, stream in zip(requests, await self._engine.generate(requests)):
            self._streams.append(stream)
            self._params.append(params)
            self._unfinished.add(request.request_id)
            self._last_token_time.append(None)

    async def admitted(self) -> None:
        """Returns once the engine has admitted every request; raises the first rejection.
        A stream waits for this before its 200, so an invalid request gets its 400."""
        for stream in self._streams:
            await stream.admitted()

    def interrupt(self, error: BaseException) -> None:
        """Ends the batch from outside: its requests are aborted and the reader gets
        ``error``."""
        self._abort_unfinished()
        self._queue.put_nowait((-1, error))

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(prompt index, cumulative output)`` pairs until every request has finished."""
        for index, stream in enumerate(self._streams):
            stream.deliver_to(functools.partial(self._receive, index))
        # An interrupt empties ``_unfinished`` but leaves its error queued for us to raise.
        while self._unfinished or not self._queue.empty():
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            self._observe(index, item)
            if item.error is not None:
                raise RequestFailedError(item.request_id, item.error)
            yield index, item

    async def final_outputs(self) -> list[RequestOutput]:
        finals: list[RequestOutput | None] = [None] * len(self._streams)
        async for index, output in self.outputs():
            finals[index] = output
        return [f for f in finals if f is not None]

    def _receive(self, index: int, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait((index, item))

    def _observe(self, index: int, output: RequestOutput) -> None:
        last = output.metrics.last_token_time
        previous = self._last_token_time[index]
        if last is not None and previous is None:
            self._metrics.observe_first_token(output)
        elif last is not None and previous is not None and last > previous:
            self._metrics.observe_inter_token_latency(last - previous)
        self._last_token_time[index] = last
        if output.finished:
            self._unfinished.discard(output.request_id)
            self._metrics.observe_finished(output, self._params[index])
            if self._tracing is not None:
                self._tracing.request_finished(output, self._params[index], self._model)

    def _abort_unfinished(self) -> None:
        for request_id in self._unfinished:
            self._engine.abort(request_id)
            self._metrics.count_aborted()
        self._unfinished.clear()


# Generations in flight, so that a shutdown past its drain timeout can end them.
BATCHES_KEY: web.AppKey[set[GenerationBatch]] = web.AppKey("batches")
