"""OpenAI-shaped errors: one exception type, one middleware that turns everything into JSON.

Handlers raise; only ``error_middleware`` builds error responses, so every failure a client
can see (bad JSON, unknown route, oversized body, engine errors) has the same body:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import orjson
from aiohttp import web

from pagedserve.server.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
)

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"


class APIError(Exception):
    """An error the server reports to the client with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        # Set when the connection's remaining bytes cannot be parsed (a broken body).
        self.close_connection = False

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_response(self) -> web.Response:
        response = web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )
        if self.close_connection:
            response.force_close()
        return response


def invalid_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param=param)


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model}` does not exist.",
        INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


# What a draining server tells clients to wait before retrying: by then another replica (or
# this one, restarted) takes the request.
DRAIN_RETRY_AFTER_S = 1


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down.", UNAVAILABLE, code="server_draining",
                    headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)})


def engine_unavailable(detail: str) -> APIError:
    return APIError(503, f"The engine is not running: {detail}", UNAVAILABLE,
                    code="engine_dead")


def body_too_large(size: int | None, limit: int, encoding: str | None = None) -> APIError:
    """413 that names what was measured: the bytes announced (Content-Length), or for a body
    without one (chunked) that the bytes read passed the limit; the limit holds for the body
    once decoded from its ``encoding``, which the message says."""
    if encoding is not None and encoding.lower() != "identity":
        sent = f"{size} bytes sent" if size is not None else "a chunked body sent"
        message = (f"Request body too large: {sent} with Content-Encoding {encoding!r} "
                   f"decompressed to more than {limit} bytes, the limit (which holds for "
                   f"the decompressed body).")
    elif size is not None:
        message = f"Request body too large: {size} bytes sent, the limit is {limit} bytes."
    else:
        message = (f"Request body too large: a chunked body sent passed {limit} bytes, the "
                   f"limit, before its end.")
    return APIError(413, message, INVALID_REQUEST, code="request_too_large")


def from_exception(exc: BaseException, request: web.Request) -> APIError:
    """The APIError a client sees for ``exc``; anything unexpected becomes a 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return invalid_request(exc.message, exc.param)
    if isinstance(exc, QueueFullError):
        retry_after = max(1, math.ceil(exc.retry_after))
        return APIError(429, exc.message, RATE_LIMIT, code="queue_full",
                        headers={"Retry-After": str(retry_after)})
    if isinstance(exc, EngineDeadError):
        return engine_unavailable(str(exc))
    if isinstance(exc, RequestFailedError):  # this request only: the engine goes on
        return APIError(500, "The server had an error while processing the output of this "
                        "request, and ended it.", SERVER_ERROR, code="request_failed")
    if isinstance(exc, web.HTTPException):
        return _from_http_exception(exc, request)
    logger.exception("unhandled error in %s %s", request.method, request.path)
    return APIError(500, "The server had an error while processing the request.", SERVER_ERROR)


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> APIError:
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
    if exc.status == 404:
        message = f"Invalid URL ({request.method} {request.path})"
        return APIError(404, message, INVALID_REQUEST, code="unknown_url")
    if exc.status == 405:
        message = f"Method {request.method} is not allowed for {request.path}"
        return APIError(405, message, INVALID_REQUEST, code="method_not_allowed",
                        headers=headers)
    if exc.status == 413:
        return body_too_large(request.content_length, request.client_max_size,
                              request.headers.get("Content-Encoding"))
    error_type = INVALID_REQUEST if exc.status < 500 else SERVER_ERROR
    return APIError(exc.status, exc.reason, error_type, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone: there is no one to answer
    except Exception as exc:
        return from_exception(exc, request).to_response()
