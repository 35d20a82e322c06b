"""The items of a batch: what goes in, what comes out, and the tally at the end."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pagedserve.client.api.client_errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APIStreamError,
    APITimeoutError,
    BudgetExceededError,
    ClientError,
    InvalidRequestError,
)
from pagedserve.client.api.resources import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from pagedserve.client.api.types import Usage
from pagedserve.client.budget.tokens import EndpointKind

ENDPOINT_PATHS: dict[EndpointKind, str] = {
    "completions": COMPLETIONS_PATH,
    "chat": CHAT_COMPLETIONS_PATH,
    "responses": RESPONSES_PATH,
}


@dataclass(slots=True, frozen=True)
class BatchRequest:
    """One request of a batch: its caller-chosen id, the endpoint and the JSON body."""

    custom_id: str
    kind: EndpointKind
    body: dict[str, Any]

    def __post_init__(self) -> None:
        if self.kind not in ENDPOINT_PATHS:
            raise ValueError(f"kind must be one of {sorted(ENDPOINT_PATHS)}, got {self.kind!r}")

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.kind]


# The OpenAI Batch API's ``error.code`` for failures that have no HTTP answer, most specific
# class first.
_ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (APITimeoutError, "timeout"),
    (APIConnectionError, "connection_error"),
    (APIResponseValidationError, "invalid_response"),
    (APIStreamError, "stream_error"),
    (InvalidRequestError, "invalid_request"),
    (BudgetExceededError, "budget_exceeded"),
    (ClientError, "client_error"),
)


def error_code(error: BaseException) -> str:
    """A short machine-readable code for ``error``: the server's for an HTTP error."""
    if isinstance(error, APIStatusError):
        return error.code or str(error.status_code)
    for cls, code in _ERROR_CODES:
        if isinstance(error, cls):
            return code
    return "internal_error"


@dataclass(slots=True, frozen=True)
class ItemError:
    """Why an item failed for good: the exception's class name, message and code."""

    type: str
    message: str
    code: str = "client_error"

    @classmethod
    def from_exception(cls, error: BaseException) -> ItemError:
        message = str(error) if isinstance(error, ClientError) else repr(error)
        return cls(type(error).__name__, message, error_code(error))


@dataclass(slots=True, frozen=True)
class BatchResult:
    """The outcome of one item. ``status_code`` and ``response`` hold the last HTTP answer
    (the error body for a failure) and ``request_id`` its ``x-request-id`` (else the body's
    ``id``); ``attempts`` counts requests sent."""

    index: int
    custom_id: str
    status_code: int | None
    response: Any
    error: ItemError | None
    usage: Usage | None
    endpoint: str | None
    attempts: int
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failure(
        cls,
        index: int,
        request: BatchRequest,
        error: BaseException,
        attempts: int,
        endpoint: str | None = None,
    ) -> BatchResult:
        status: int | None = None
        body: Any = None
        request_id: str | None = None
        if isinstance(error, APIStatusError):
            status, body = error.status_code, error.body
            request_id = error.headers.get("x-request-id")
        return cls(
            index=index,
            custom_id=request.custom_id,
            status_code=status,
            response=body,
            error=ItemError.from_exception(error),
            usage=None,
            endpoint=endpoint,
            attempts=attempts,
            request_id=request_id,
        )


@dataclass(slots=True)
class BatchSummary:
    """Counts over a run. ``skipped`` are items a resumed run found already done;
    ``previously_failed`` are those of them whose earlier result is a failure that this run
    did not retry, so ``unresolved`` counts every item still without a successful result."""

    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    previously_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def unresolved(self) -> int:
        return self.failed + self.previously_failed

    @property
    def elapsed_s(self) -> float:
        end = self.finished_at if self.finished_at is not None else time.monotonic()
        return end - self.started_at

    @property
    def tokens_per_second(self) -> float:
        elapsed = self.elapsed_s
        total = self.prompt_tokens + self.completion_tokens
        return total / elapsed if elapsed > 0 else 0.0

    def record(self, result: BatchResult) -> None:
        self.attempts += result.attempts
        if result.error is not None:
            self.failed += 1
            self.errors[result.error.type] += 1
            return
        self.succeeded += 1
        if result.usage is not None:
            self.prompt_tokens += result.usage.prompt_tokens
            self.completion_tokens += result.usage.completion_tokens

    def describe(self) -> str:
        """One line for a terminal."""
        line = (
            f"{self.succeeded} succeeded, {self.failed} failed, {self.skipped} skipped "
            f"in {self.elapsed_s:.1f} s ({self.tokens_per_second:.0f} tokens/s, "
            f"{self.attempts} requests sent)"
        )
        if self.errors:
            line += "; errors: " + ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items()))
        if self.unresolved:
            total = self.done + self.skipped
            line += (
                f"; {self.unresolved} of {total} items have no successful result "
                "(rerun to retry them)"
            )
        return line
