"""The client's error hierarchy, shaped like openai-python's.

Every error the client raises on purpose derives from ``ClientError``. ``APIError`` (OpenAI's
error object and its status) and ``InvalidRequestError`` are the server's too
(``pagedserve.common.errors``). HTTP status errors map
to one class per code so callers can ``except RateLimitError`` without parsing messages; the
server's own message (OpenAI's ``{"error": {"message": ...}}``) is kept verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import orjson
from multidict import CIMultiDict

from pagedserve.common.errors import APIError, PagedServeError
from pagedserve.common.errors import InvalidRequestError as InvalidRequestError  # re-exported

_MAX_BODY_IN_MESSAGE = 500


ClientError = PagedServeError
"""Base class of every error the pagedserve client raises on purpose (pagedserve's base)."""


class APIConnectionError(APIError):
    """The server could not be reached, or the connection broke before an answer."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message, url=url)


class APITimeoutError(APIConnectionError):
    """Connecting, the whole request, or the gap between stream chunks took too long."""


class StreamInterruptedError(APIConnectionError):
    """A stream broke after it had delivered chunks; it is not retried behind the caller's back
    because the caller has already seen part of the answer."""

    def __init__(self, chunks_received: int, cause: BaseException, *, url: str | None = None):
        super().__init__(
            f"stream interrupted after {chunks_received} chunk(s): {cause!r}", url=url
        )
        self.chunks_received = chunks_received


class APIResponseValidationError(APIError):
    """The server answered with something that is not the expected JSON or SSE."""


class APIStreamError(APIError):
    """The server sent an ``error`` object inside an otherwise healthy stream."""


class APIStatusError(APIError):
    """The server answered with a 4xx or 5xx status."""

    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        headers: Mapping[str, str],
        body: Any = None,
        url: str | None = None,
    ) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        super().__init__(_status_message(status_code, message), status=status_code,
                         type=error.get("type"), param=error.get("param"),
                         code=error.get("code"), url=url, body=body)
        self.status_code = status_code
        self.headers = CIMultiDict(headers)
        self.server_message = message


class BadRequestError(APIStatusError):
    status_code = 400


class AuthenticationError(APIStatusError):
    status_code = 401


class PermissionDeniedError(APIStatusError):
    status_code = 403


class NotFoundError(APIStatusError):
    status_code = 404


class RequestTimeoutError(APIStatusError):
    status_code = 408


class ConflictError(APIStatusError):
    status_code = 409


class UnprocessableEntityError(APIStatusError):
    status_code = 422


class RateLimitError(APIStatusError):
    status_code = 429


class InternalServerError(APIStatusError):
    """Any 5xx: the server failed, is overloaded or is draining."""


class BudgetExceededError(ClientError, ValueError):
    """A request needs more in-flight tokens than the whole budget; it could never be sent."""

    def __init__(self, tokens: int, limit: int, what: str = "in-flight token budget") -> None:
        super().__init__(f"request needs {tokens} tokens but the {what} is {limit}")
        self.tokens = tokens
        self.limit = limit


class BatchInputError(ClientError, ValueError):
    """A line of a batch input file that cannot be turned into a request."""

    def __init__(self, source: str, line_number: int, reason: str) -> None:
        super().__init__(f"{source}:{line_number}: {reason}")
        self.source = source
        self.line_number = line_number
        self.reason = reason


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def _status_message(status_code: int, message: str) -> str:
    try:
        phrase = HTTPStatus(status_code).phrase
    except ValueError:
        phrase = "Error"
    return f"{status_code} {phrase}: {message}" if message else f"{status_code} {phrase}"


def _server_message(body: Any) -> str:
    """OpenAI's ``error.message``; otherwise the body as text, trimmed for readability."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return body["message"]
    text = body if isinstance(body, str) else orjson.dumps(body).decode() if body else ""
    return text.strip()[:_MAX_BODY_IN_MESSAGE]


def decode_error_body(raw: bytes) -> Any:
    """The JSON value of an error body, or its text when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", errors="replace")


def transport_error(exc: BaseException, url: str | None) -> APIConnectionError:
    """The client error for an aiohttp / socket failure while talking to ``url``."""
    if isinstance(exc, TimeoutError):
        return APITimeoutError(f"request to {url} timed out", url=url)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return APIConnectionError(f"connection to {url} failed: {detail}", url=url)


def make_status_error(
    status_code: int, body: Any, headers: Mapping[str, str], url: str | None = None
) -> APIStatusError:
    """The ``APIStatusError`` subclass for ``status_code``, carrying the server's message."""
    if status_code >= 500:
        cls: type[APIStatusError] = InternalServerError
    else:
        cls = _STATUS_CLASSES.get(status_code, APIStatusError)
    return cls(
        _server_message(body), status_code=status_code, headers=headers, body=body, url=url
    )
