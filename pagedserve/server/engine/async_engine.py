"""The engine behind the server: the step loop runs in its own thread, each request gets an
async stream of outputs.

Requests and aborts cross into the loop thread through a queue, so an HTTP handler never
waits for a model step; outputs cross back with ``call_soon_threadsafe``. torch releases the
GIL inside its ops, so the event loop keeps serving while the model computes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pagedserve.common.engine_errors import EngineDeadError, InvalidRequestError
from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.request_preparation import EngineRequest, PreparedRequest
from pagedserve.server.engine.engine_snapshot import EngineSnapshot, SnapshotPublisher
from pagedserve.server.engine.engine_stats import EngineStats, StepStats
from pagedserve.server.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5
# Fault injection for tests of the failure path, off unless set: the step with this 1-based
# number raises instead of running, as a failed model forward would.
FAIL_STEP_ENV = "PAGEDSERVE_FAIL_STEP"
# Requests with this many prompt tokens together are checked in a worker thread: below it the
# thread hop costs more than the check.
PREPARE_OFF_LOOP_TOKENS = 16384


class InjectedStepFailure(RuntimeError):
    """The failure ``PAGEDSERVE_FAIL_STEP`` asks for."""


class RequestStream:
    """Async iterator of one request's outputs; closing it early aborts the request."""

    def __init__(self, request_id: str, engine: AsyncEngine) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sink: Callable[[RequestOutput | BaseException], None] | None = None
        self.finished = False

    def put(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self.settle_admission(item)
        if self._sink is None:
            self._queue.put_nowait(item)
        else:
            self._forward(item)

    def deliver_to(self, sink: Callable[[RequestOutput | BaseException], None]) -> None:
        """From now on each item goes straight to ``sink``, on the event loop and in order,
        instead of waiting in this stream for an iterator: one task switch less per token.
        What is already waiting goes first. The stream is not iterated after this."""
        self._sink = sink
        while not self._queue.empty():
            self._forward(self._queue.get_nowait())

    def _forward(self, item: RequestOutput | BaseException) -> None:
        self.finished = isinstance(item, BaseException) or item.finished
        if self._sink is not None:
            self._sink(item)

    def settle_admission(self, error: BaseException | None = None) -> None:
        if not self._admitted.done():
            if error is None:
                self._admitted.set_result(None)
            else:
                self._admitted.set_exception(error)
                self._admitted.exception()  # retrieved: the queue reports it too

    async def admitted(self) -> None:
        """Returns once the loop thread has admitted the request; raises what rejected it
        (the scheduler's limits are checked there), so a stream can still answer 400."""
        await asyncio.shield(self._admitted)

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self._engine.abort(self.request_id)

    async def aclose(self) -> None:
        if not self.finished:
            self._engine.abort(self.request_id)
            self.finished = True


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.engine_args = engine.args
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self.model_name = engine.args.model
        # ("add", request, prepared, arrival) or ("abort", request_id)
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self._failed: asyncio.Event | None = None
        self._stats = engine.stats(with_projection=True)
        self._snapshots = SnapshotPublisher(engine.scheduler)
        engine.add_step_observer(self._snapshots)
        self._num_steps = 0
        self._came_round_at = time.monotonic()  # the step loop's latest pass
        self._fail_step = int(os.environ.get(FAIL_STEP_ENV) or 0)
        # Grammars compile here, never in the step loop; a compilation past its timeout
        # cannot be stopped, so few threads bound what runaway ones can take.
        self._grammar_pool = ThreadPoolExecutor(max_workers=2,
                                                thread_name_prefix="pagedserve-grammar")

    @classmethod
    async def launch(cls, args: EngineArgs) -> AsyncEngine:
        """Builds the engine in a new thread and runs its step loop in that same thread;
        returns once it is built (raising what the build raised).

        All of torch's work then happens in one thread. libgomp gives every thread that opens
        a parallel region a worker pool of its own, and once it manages more threads than
        there are cores its workers stop spinning between regions and sleep: with the model
        built in one thread and stepped in another, decode made 40x the context switches and
        ran about 15% slower.
        """
        loop = asyncio.get_running_loop()
        built: asyncio.Future[AsyncEngine] = loop.create_future()
        go = threading.Event()
        abandoned = False  # the caller was cancelled while the engine was building

        def build_then_run() -> None:
            try:
                engine = cls(LLMEngine(args))
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, built, None, exc)
                return
            loop.call_soon_threadsafe(_settle, built, engine, None)
            go.wait()
            if abandoned:
                engine.engine.shutdown()
            else:
                engine._run()

        thread = threading.Thread(target=build_then_run, name="pagedserve-engine", daemon=True)
        thread.start()
        try:
            engine = await asyncio.shield(built)
        except asyncio.CancelledError:
            abandoned = True
            go.set()
            raise
        engine._bind(loop, thread)
        go.set()
        return engine

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Runs the step loop in a new thread (for an engine built by the caller)."""
        thread = threading.Thread(target=self._run, name="pagedserve-engine", daemon=True)
        self._bind(asyncio.get_running_loop(), thread)
        thread.start()

    def _bind(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._loop = loop
        self._failed = asyncio.Event()
        self._thread = thread

    async def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.engine.shutdown)
        self._grammar_pool.shutdown(wait=False, cancel_futures=True)
        self._fail_all(EngineDeadError("the engine has shut down"))

    @property
    def failure(self) -> BaseException | None:
        """What stopped the step loop, or None while it runs (or after a clean shutdown)."""
        return self._failure

    async def wait_failure(self) -> BaseException:
        """Returns once the step loop has failed (never after a clean shutdown)."""
        assert self._failed is not None, "start() first"
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    def stalled_for(self) -> float:
        """Seconds since the step loop last came round while it holds requests; 0.0 while it
        holds none. An idle loop comes round twice a second and a busy one after every step,
        so this grows only while a step (or the loop) is stuck."""
        if not self._streams:
            return 0.0
        return time.monotonic() - self._came_round_at

    @property
    def is_healthy(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._failure is None
                and not self._stopping)

    # -- requests -------------------------------------------------------------------------

    async def generate(self, requests: Sequence[EngineRequest]) -> list[RequestStream]:
        """The server's door into the engine: the engine requests behind one caller's request,
        each checked once (``LLMEngine.prepare_request``; off the event loop for a long
        prompt), its structured output's grammar compiled off the event loop and the step
        loop, and the waiting queue's room counted, before any is added; their streams come
        back in order and the loop thread admits them before its next step.

        Raises InvalidRequestError (a request the engine can never serve, an invalid
        constraint or one that takes longer than ``grammar_compile_timeout`` to compile),
        QueueFullError or EngineDeadError; then none of them was added."""
        prepared = await self._prepare(requests)
        prepared = await self._with_grammars(prepared)
        if not self.is_healthy:
            raise EngineDeadError("the engine is not running")
        arriving = self._inbox.qsize()
        for i in range(len(prepared)):
            self.engine.check_queue_room(num_arriving=arriving + i)
        streams = []
        for request, ready in zip(requests, prepared):
            stream = RequestStream(request.request_id, self)
            self._streams[request.request_id] = stream
            self._inbox.put(("add", request, ready, time.monotonic()))
            streams.append(stream)
        self._wakeup.set()
        return streams

    async def _prepare(self, requests: Sequence[EngineRequest]) -> list[PreparedRequest]:
        def prepare() -> list[PreparedRequest]:
            return [self.engine.prepare_request(r.prompt_token_ids, r.params) for r in requests]

        if sum(len(r.prompt_token_ids) for r in requests) < PREPARE_OFF_LOOP_TOKENS:
            return prepare()
        return await asyncio.to_thread(prepare)

    async def _with_grammars(self, prepared: list[PreparedRequest]) -> list[PreparedRequest]:
        """Each request with its grammar; a constraint the requests share compiles once."""
        grammars: dict[int, Any] = {}
        ready = []
        for request in prepared:
            spec = request.params.structured_outputs
            if spec is None:
                ready.append(request)
                continue
            if id(spec) not in grammars:
                grammars[id(spec)] = await self._compile_grammar(spec)
            ready.append(replace(request, grammar=grammars[id(spec)]))
        return ready

    async def _compile_grammar(self, spec: StructuredOutputsParams) -> Any:
        timeout = self.engine_args.grammar_compile_timeout
        work = asyncio.get_running_loop().run_in_executor(
            self._grammar_pool, self.engine.compile_grammar, spec)
        try:
            return await asyncio.wait_for(work, timeout)
        except TimeoutError:
            raise InvalidRequestError(
                f"{spec.source} took longer than {timeout:g} s to compile; simplify it "
                "(the server's --grammar-compile-timeout)", param=spec.source) from None

    def abort(self, request_id: str) -> None:
        """Thread-safe and idempotent; the loop frees the request's blocks before its next
        step, and the stream, if still read, ends with a final output (finish_reason
        "abort")."""
        if request_id in self._streams:
            self._inbox.put(("abort", request_id))
            self._wakeup.set()

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (cheap: no lock, no scan)."""
        return self._stats

    def snapshot(self) -> EngineSnapshot:
        """The latest snapshot of blocks, queues and step time; the loop builds a fresh one
        after its next step, or at once when idle (``SnapshotPublisher``)."""
        snapshot = self._snapshots.latest()
        self._wakeup.set()
        return snapshot

    def add_step_observer(self, observer: Callable[[StepStats], None]) -> None:
        """``observer(StepStats)`` runs in the engine thread after every step."""
        self.engine.add_step_observer(observer)

    # -- the loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._came_round_at = time.monotonic()
                self._drain_inbox()
                self._snapshots.publish()
                if not self.engine.has_unfinished_requests():
                    self.engine.check_health()  # a tensor-parallel worker may die while idle
                    self._wakeup.wait(_IDLE_WAIT_S)
                    self._wakeup.clear()
                    continue
                self._step()
        except BaseException as exc:  # the loop must report, not vanish
            logger.exception("engine loop failed")
            self._failure = exc
            self._fail_all(EngineDeadError(f"the engine loop failed: {exc!r}"))
            if self._failed is not None:
                self._to_loop(self._failed.set)

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if message[0] == "add":
                self._admit(*message[1:])
            else:
                final = self.engine.abort_request(message[1])
                if final is not None:
                    self._deliver([final])
                else:
                    self._streams.pop(message[1], None)  # already finished
                self._stats = self.engine.stats(with_projection=True)

    def _admit(self, request: EngineRequest, prepared: PreparedRequest,
               arrival: float) -> None:
        stream = self._streams.get(request.request_id)
        if stream is None:
            return  # aborted before admission
        try:
            self.engine.add_prepared(request, prepared, arrival_time=arrival)
        except Exception as exc:  # rejected by the scheduler: the caller gets the error
            self._send(request.request_id, exc)
            return
        self._to_loop(stream.settle_admission)

    def _step(self) -> None:
        self._num_steps += 1
        if self._num_steps == self._fail_step:
            raise InjectedStepFailure(f"step {self._num_steps} failed on purpose "
                                      f"({FAIL_STEP_ENV}={self._fail_step})")
        outputs = self.engine.step()
        self._stats = self.engine.stats(with_projection=True)
        self._deliver(outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hands the step's outputs to the event loop in one wake-up: one per request would
        write the loop's wake-up pipe hundreds of times a step at a large batch."""
        delivery = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                self._streams.pop(output.request_id, None)
            delivery.append((stream, output))
        if delivery:
            self._to_loop(_put_all, delivery)

    def _send(self, request_id: str, exc: BaseException) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._to_loop(stream.put, exc)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        """``callback(*args)`` on the event loop the engine was started from."""
        if self._loop is None:
            raise RuntimeError("the engine was not started")
        self._loop.call_soon_threadsafe(callback, *args)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._streams):
            self._send(request_id, exc)


def _put_all(delivery: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, output in delivery:
        stream.put(output)


def _settle(future: asyncio.Future[AsyncEngine], result: AsyncEngine | None,
            error: BaseException | None) -> None:
    if error is not None:
        future.set_exception(error)
    elif result is not None:
        future.set_result(result)
