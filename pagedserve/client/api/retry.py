"""When to retry a failed request and how long to wait first.

Retried: connection errors, timeouts, 408, 409, 429 and every 5xx except those whose error
``code`` says the endpoint cannot serve anything until it is restarted (a pagedserve or vLLM
engine that died: ``engine_dead``), which would fail the same way however long the retries
went on. The wait is the server's
``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date) when it sends one within
``max_retry_after``; otherwise exponential backoff with jitter, so that many clients that
failed together do not come back together.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from pagedserve.client.api.client_errors import APIConnectionError, APIStatusError

RETRYABLE_STATUS = frozenset({408, 409, 429})
# 5xx error codes that no retry on the same endpoint can turn into a success.
FATAL_ERROR_CODES = frozenset({"engine_dead"})


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    """``max_retries`` retries after the first attempt; waits grow from ``initial_backoff``
    by ``multiplier`` up to ``max_backoff``, each shortened by up to ``jitter`` of itself."""

    max_retries: int = 2
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.25
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {self.max_retries}")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError(
                "backoff must satisfy 0 <= initial_backoff <= max_backoff, got "
                f"initial_backoff={self.initial_backoff}, max_backoff={self.max_backoff}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def backoff(self, retry_index: int, rand: Callable[[], float] = random.random) -> float:
        """The wait before retry number ``retry_index`` (0-based) when the server named none."""
        base = min(self.initial_backoff * self.multiplier**retry_index, self.max_backoff)
        return base * (1.0 - self.jitter * rand())

    def delay(self, retry_index: int, error: BaseException) -> float:
        """The wait before the next attempt after ``error``."""
        if isinstance(error, APIStatusError):
            hinted = retry_after_seconds(error.headers)
            if hinted is not None and hinted <= self.max_retry_after:
                return hinted
        return self.backoff(retry_index)


def is_retryable(error: BaseException) -> bool:
    """Whether another attempt may succeed where this one failed."""
    if isinstance(error, APIStatusError):
        if error.code in FATAL_ERROR_CODES:
            return False
        return error.status_code in RETRYABLE_STATUS or error.status_code >= 500
    return isinstance(error, APIConnectionError)


def endpoint_is_down(error: BaseException) -> bool:
    """Whether ``error`` says its endpoint serves nothing until restarted; another replica
    may still take the request."""
    return isinstance(error, APIStatusError) and error.code in FATAL_ERROR_CODES


def retry_after_seconds(
    headers: Mapping[str, str], now: Callable[[], float] = time.time
) -> float | None:
    """The server's requested wait: ``retry-after-ms``, else ``Retry-After`` in seconds or as
    an HTTP date. None when absent, unparsable or a negative number."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _finite_float(lowered.get("retry-after-ms"))
    if millis is not None and millis >= 0:
        return millis / 1000.0
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _finite_float(value)
    if seconds is None:
        try:
            # A date already past means "now".
            return max(0.0, parsedate_to_datetime(value).timestamp() - now())
        except (TypeError, ValueError, IndexError):
            return None
    return seconds if seconds >= 0 else None


def _finite_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
