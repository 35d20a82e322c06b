"""``BatchRunner``: many requests through a budget, nothing lost, errors kept per item.

A producer feeds a bounded ``asyncio.Queue`` (so a 100,000-line input is never all in memory
as tasks); workers take an item, count its tokens, wait for an endpoint with room, send it,
and settle. Retryable failures (connection errors, timeouts, 408/409/429/5xx) go back to the
pool with the item's first ticket, so they are retried early and possibly elsewhere; an
endpoint whose engine is dead (503 ``engine_dead``) is not retried, though another replica
may take the item; other failures and exhausted retries become the item's result and the
batch goes on.

The budget, not the worker count, is what limits load: ``num_workers`` only needs to exceed
the number of requests the budget lets through at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sized
from typing import Any

from pagedserve.client.api.client_errors import ClientError, InvalidRequestError
from pagedserve.client.api.response_types import Response
from pagedserve.client.api.retry import endpoint_is_down, is_retryable
from pagedserve.client.api.types import ChatCompletion, Completion, parse_response
from pagedserve.client.batch.items import BatchRequest, BatchResult, BatchSummary
from pagedserve.client.batch.pool import EndpointPool, Grant
from pagedserve.client.batch.progress import BatchProgress
from pagedserve.client.budget.tokens import TiktokenCounter, TokenCounter, reserved_tokens
from pagedserve.common.load_hints import LoadHints

DEFAULT_NUM_WORKERS = 256
DEFAULT_MAX_ATTEMPTS = 6
# The assumed answer length of a chat request with no max_tokens whose context length the
# counter could not learn: the reservation has to be some finite number.
DEFAULT_CHAT_MAX_TOKENS = 1024

_STOP = object()


class _WorkerFailed:
    """A worker died of something other than an item's failure (a bug, a full disk)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class BatchRunner:
    def __init__(
        self,
        pool: EndpointPool,
        *,
        counter: TokenCounter | None = None,
        num_workers: int = DEFAULT_NUM_WORKERS,
        queue_size: int | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        default_max_tokens: int = DEFAULT_CHAT_MAX_TOKENS,
        on_result: Callable[[BatchResult], None] | None = None,
        progress: bool = False,
        total: int | None = None,
    ) -> None:
        """``on_result`` runs as each item finishes, before it is yielded (the JSONL writer
        hooks in here); ``progress`` shows a tqdm bar over ``total`` items (by default the
        length of the requests when they have one), with an ETA when the total is known."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.pool = pool
        self.counter = counter or TiktokenCounter()
        self.num_workers = num_workers
        self.queue_size = queue_size or 2 * num_workers
        self.max_attempts = max_attempts
        self.default_max_tokens = default_max_tokens
        self.on_result = on_result
        self.progress = progress
        self.total = total
        self.summary = BatchSummary()

    async def run(
        self, requests: Iterable[BatchRequest] | AsyncIterable[BatchRequest]
    ) -> list[BatchResult]:
        """Every result, in input order."""
        async with contextlib.aclosing(self.results(requests, ordered=True)) as results:
            return [result async for result in results]

    async def results(
        self,
        requests: Iterable[BatchRequest] | AsyncIterable[BatchRequest],
        *,
        ordered: bool = False,
    ) -> AsyncIterator[BatchResult]:
        """Results as they complete, or in input order with ``ordered=True``. Closing the
        iterator or cancelling its consumer stops the workers and frees their budget."""
        self.summary = BatchSummary()
        total = self.total
        if total is None and isinstance(requests, Sized):
            total = len(requests)
        bar = BatchProgress(
            total, self.summary, lambda: self.pool.in_flight_tokens, enabled=self.progress
        )
        queue: asyncio.Queue[Any] = asyncio.Queue(self.queue_size)
        finished: asyncio.Queue[Any] = asyncio.Queue()
        producer = asyncio.create_task(self._produce(requests, queue))
        workers = [
            asyncio.create_task(self._work(queue, finished, bar)) for _ in range(self.num_workers)
        ]
        try:
            async for result in self._collect(finished, ordered):
                yield result
            await producer  # an input error surfaces here, after the items before it
        finally:
            for task in [producer, *workers]:
                task.cancel()
            await asyncio.gather(producer, *workers, return_exceptions=True)
            self.summary.finished_at = time.monotonic()
            bar.close()

    async def _collect(
        self, finished: asyncio.Queue[Any], ordered: bool
    ) -> AsyncIterator[BatchResult]:
        pending: dict[int, BatchResult] = {}
        next_index = 0
        live_workers = self.num_workers
        while live_workers:
            item = await finished.get()
            if item is _STOP:
                live_workers -= 1
            elif isinstance(item, _WorkerFailed):
                raise item.error
            elif not ordered:
                yield item
            else:
                pending[item.index] = item
                while next_index in pending:
                    yield pending.pop(next_index)
                    next_index += 1

    async def _produce(
        self,
        requests: Iterable[BatchRequest] | AsyncIterable[BatchRequest],
        queue: asyncio.Queue[Any],
    ) -> None:
        index = 0
        try:
            if isinstance(requests, AsyncIterable):
                async for request in requests:
                    await queue.put((index, request))
                    index += 1
            else:
                for request in requests:
                    await queue.put((index, request))
                    index += 1
        except asyncio.CancelledError:
            raise
        except BaseException:
            # Items already queued still finish; then the error reaches the consumer.
            await self._stop_workers(queue)
            raise
        self.summary.submitted = index
        await self._stop_workers(queue)

    async def _stop_workers(self, queue: asyncio.Queue[Any]) -> None:
        for _ in range(self.num_workers):
            await queue.put(_STOP)

    async def _work(
        self, queue: asyncio.Queue[Any], finished: asyncio.Queue[Any], bar: BatchProgress
    ) -> None:
        try:
            while (item := await queue.get()) is not _STOP:
                result = await self.process(*item)
                self.summary.record(result)
                if self.on_result is not None:
                    self.on_result(result)
                bar.advance()
                finished.put_nowait(result)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            finished.put_nowait(_WorkerFailed(exc))
            raise
        finished.put_nowait(_STOP)

    async def process(self, index: int, request: BatchRequest) -> BatchResult:
        """Run one item to its final result, retrying as allowed."""
        try:
            tokens = await self._plan(request)
        except ClientError as exc:
            return BatchResult.failure(index, request, exc, attempts=0)
        ticket = self.pool.next_ticket()
        attempt = 0
        while True:
            attempt += 1
            grant = await self.pool.acquire(tokens, ticket)
            try:
                answer = await self._send(grant, request)
            except ClientError as exc:
                retryable = is_retryable(exc) or self._elsewhere(exc)
                self.pool.report_failure(grant, exc, retryable=retryable)
                if retryable and attempt < self.max_attempts:
                    continue
                return BatchResult.failure(index, request, exc, attempt, grant.endpoint.name)
            except BaseException:
                grant.reservation.settle(None)
                raise
            return self._succeeded(index, request, grant, answer, attempt)

    def _succeeded(
        self,
        index: int,
        request: BatchRequest,
        grant: Grant,
        answer: Completion | ChatCompletion | Response,
        attempts: int,
    ) -> BatchResult:
        usage = answer.usage
        headers = answer.response_headers
        hints = LoadHints.from_headers(headers)
        self.pool.report_success(grant, usage.total_tokens if usage else None, hints,
                                 usage.completion_tokens if usage else None)
        return BatchResult(
            index=index,
            custom_id=request.custom_id,
            status_code=200,
            response=answer.raw,
            error=None,
            usage=usage,
            endpoint=grant.endpoint.name,
            attempts=attempts,
            request_id=headers.get("x-request-id") or _body_id(answer.raw),
        )

    def _elsewhere(self, error: ClientError) -> bool:
        """A dead endpoint cools down while another replica takes the item."""
        return endpoint_is_down(error) and len(self.pool.endpoints) > 1

    async def _plan(self, request: BatchRequest) -> int:
        if request.body.get("stream"):
            raise InvalidRequestError.expected("stream", request.body["stream"], "false in a batch")
        count = await self.counter.count(request.kind, request.body)
        tokens = reserved_tokens(request.kind, request.body, count, self.default_max_tokens)
        self.pool.check_fits(tokens)
        return tokens

    async def _send(self, grant: Grant,
                    request: BatchRequest) -> Completion | ChatCompletion | Response:
        response = await grant.endpoint.client.request_json("POST", request.path, request.body)
        cls = _ANSWER_TYPES[request.kind]
        return parse_response(cls.from_dict, response.data, response.headers)



_ANSWER_TYPES = {"completions": Completion, "chat": ChatCompletion, "responses": Response}


def _body_id(body: Any) -> str | None:
    value = body.get("id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
