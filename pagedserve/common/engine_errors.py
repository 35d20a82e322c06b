"""Typed exceptions the engine raises; the API layer maps each to an OpenAI-shaped error.
``InvalidRequestError`` and the base class are shared with the client (``pagedserve.common``)."""

from __future__ import annotations

from pagedserve.common.errors import InvalidRequestError, PagedServeError

__all__ = [
    "BlockAllocationError",
    "EngineDeadError",
    "InvalidRequestError",
    "PagedServeError",
    "QueueFullError",
    "RequestFailedError",
    "WorkerFailedError",
]


class QueueFullError(PagedServeError):
    """The waiting queue is at its limit; the caller should retry later."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class RequestFailedError(PagedServeError):
    """The engine ended one request because processing its output raised; the engine and
    every other request go on. ``RequestOutput.error`` of that request says why."""

    def __init__(self, request_id: str, detail: str) -> None:
        super().__init__(f"request {request_id!r} failed: {detail}")
        self.request_id = request_id
        self.detail = detail


class EngineDeadError(PagedServeError):
    """The engine's step loop has stopped; no request can make progress."""


class BlockAllocationError(PagedServeError):
    """Misuse of the block pool (double free, freeing an unknown block, pool exhausted)."""


class WorkerFailedError(EngineDeadError):
    """A tensor-parallel worker died, hung past the collective timeout or failed to start.
    The model is split across the ranks, so no step can run without it: the engine is dead
    and its process should exit for a supervisor to restart it."""
