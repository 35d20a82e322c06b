"""The timed part of a run: send requests on schedule, collect one result per request.

The arrival schedule is drawn before the clock starts and bodies are serialized up front, so
the send loop only compares clocks and spawns tasks. If the loop still falls behind, a
request goes out late but keeps its scheduled time, and latency measured from that time
shows the delay (no coordinated omission); the lag itself is recorded per request and, for
the event loop as a whole, by :class:`LoopLagMonitor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import time
from dataclasses import dataclass

import aiohttp
import orjson
from tqdm import tqdm

from pagedserve.loadgen.arrivals import arrivals_rng, schedule
from pagedserve.loadgen.bench_config import LoadShape, RequestSpec
from pagedserve.loadgen.bench_errors import BenchmarkAbortedError
from pagedserve.loadgen.datasets import SampleRequest
from pagedserve.loadgen.request import RequestResult, build_payload, send_request


class LoopLagMonitor:
    """How long a callback waits in the event loop's ready queue, sampled every interval.

    A chunk's timestamp is taken when its reader resumes, so this backlog bounds how late
    those timestamps can be.
    """

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._post)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _post(self) -> None:
        assert self._loop is not None
        self._handle = self._loop.call_soon(self._record, time.perf_counter())

    def _record(self, posted: float) -> None:
        assert self._loop is not None
        self.samples.append(time.perf_counter() - posted)
        self._handle = self._loop.call_later(self.interval, self._post)


@dataclass(slots=True)
class RunOutcome:
    results: list[RequestResult]  # in request_id order
    start: float  # perf_counter when the first request was due
    duration: float  # from start until the last request finished
    loop_lag: list[float]  # seconds, one per LoopLagMonitor sample


class BenchmarkRunner:
    """Sends ``samples`` (cycled) to one endpoint under one load shape."""

    def __init__(self, session: aiohttp.ClientSession, spec: RequestSpec, shape: LoadShape,
                 samples: list[SampleRequest], seed: int = 0, show_progress: bool = True,
                 api_key: str | None = None) -> None:
        self._session = session
        self._spec = spec
        self._shape = shape
        self._samples = samples
        self._seed = seed
        self._show_progress = show_progress
        self._bodies = [orjson.dumps(build_payload(spec, s)) for s in samples]
        self._headers = {"Content-Type": "application/json", **spec.headers}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=spec.request_timeout)
        self._slots = (asyncio.Semaphore(shape.max_concurrency)
                       if shape.max_concurrency is not None else None)
        self._results: list[RequestResult] = []
        self._progress: tqdm | None = None

    async def run(self) -> RunOutcome:
        await self._warm_up()
        offsets = schedule(self._shape, arrivals_rng(self._seed)) if self._is_open else None
        total = len(offsets) if offsets is not None else None
        monitor = LoopLagMonitor()
        self._results = []
        # Everything allocated so far (prompts, bodies, the schedule) is moved out of the
        # collector's reach, so full collections during the run stay short.
        gc.collect()
        gc.freeze()
        with tqdm(total=total, disable=not self._show_progress, unit="req",
                  dynamic_ncols=True) as self._progress:
            monitor.start()
            start = time.perf_counter()
            try:
                if offsets is not None:
                    await self._open_loop(offsets.tolist(), start)
                else:
                    await self._closed_loop(start)
            finally:
                monitor.stop()
                gc.unfreeze()
            duration = time.perf_counter() - start
        self._results.sort(key=lambda r: r.request_id)
        return RunOutcome(self._results, start, duration, monitor.samples)

    @property
    def _is_open(self) -> bool:
        return self._shape.is_open_loop or self._shape.duration is None

    async def _open_loop(self, due: list[float], start: float) -> None:
        tasks: list[asyncio.Task[None]] = []
        i = 0
        while i < len(due):
            elapsed = time.perf_counter() - start
            while i < len(due) and due[i] <= elapsed:
                tasks.append(asyncio.create_task(self._one(i, start + due[i])))
                i += 1
            if i < len(due):
                await asyncio.sleep(due[i] - (time.perf_counter() - start))
        await asyncio.gather(*tasks)

    async def _closed_loop(self, start: float) -> None:
        """Each of max_concurrency workers sends its next request as soon as one finishes."""
        deadline = start + (self._shape.duration or 0.0)
        counter = itertools.count()

        async def worker() -> None:
            while (now := time.perf_counter()) < deadline:
                await self._one(next(counter), now)

        await asyncio.gather(*(worker() for _ in range(self._shape.max_concurrency or 1)))

    async def _one(self, request_id: int, scheduled: float) -> None:
        result = await self._send(request_id, scheduled)
        self._results.append(result)
        if self._progress is not None:
            self._progress.update(1)

    async def _send(self, request_id: int, scheduled: float) -> RequestResult:
        index = request_id % len(self._samples)
        sample = self._samples[index]
        result = RequestResult(request_id, sample.prompt_len, sample.expected_output_len,
                               scheduled=scheduled, started=time.perf_counter())
        async with self._slots or contextlib.nullcontext():
            await send_request(self._session, self._spec.url, self._bodies[index],
                               self._headers, result, self._timeout, self._spec.streams)
        return result

    async def _warm_up(self) -> None:
        """Untimed requests (cycling the dataset) to open connections and fill caches."""
        count = self._shape.num_warmups
        if count == 0:
            return
        now = time.perf_counter()
        results = await asyncio.gather(*(self._send(i, now) for i in range(count)))
        if all(not r.success for r in results):
            raise BenchmarkAbortedError(
                f"all {count} warm-up requests failed; the first error: {results[0].error}")

