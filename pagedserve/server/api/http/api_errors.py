"""OpenAI-shaped errors: one exception type, one middleware that turns everything into JSON.

Handlers raise; only ``error_middleware`` builds error responses, so every failure a client
can see (bad JSON, unknown route, oversized body, engine errors) has the same body:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import logging
import math

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from pagedserve.common.engine_errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
)
from pagedserve.common.errors import APIError

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"


def error_response(error: APIError) -> web.Response:
    """``error`` as the HTTP response the client gets."""
    response = web.Response(
        status=error.status or 500,
        body=orjson.dumps(error.error_object()),
        content_type="application/json",
        headers=error.headers,
    )
    if error.close_connection:
        response.force_close()
    return response


def invalid_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, status=400, type=INVALID_REQUEST, param=param)


def model_not_found(model: str) -> APIError:
    return APIError(
        f"The model `{model}` does not exist.",
        status=404,
        type=INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


# What a draining server tells clients to wait before retrying: by then another replica (or
# this one, restarted) takes the request.
DRAIN_RETRY_AFTER_S = 1


def shutting_down() -> APIError:
    return APIError("The server is shutting down.", status=503, type=UNAVAILABLE,
                    code="server_draining", headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)})


def engine_unavailable(detail: str) -> APIError:
    return APIError(f"The engine is not running: {detail}", status=503, type=UNAVAILABLE,
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
    return APIError(message, status=413, type=INVALID_REQUEST, code="request_too_large")


def from_exception(exc: BaseException, request: web.Request) -> APIError:
    """The APIError a client sees for ``exc``; anything unexpected becomes a 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return invalid_request(exc.message, exc.param)
    if isinstance(exc, QueueFullError):
        retry_after = max(1, math.ceil(exc.retry_after))
        return APIError(exc.message, status=429, type=RATE_LIMIT, code="queue_full",
                        headers={"Retry-After": str(retry_after)})
    if isinstance(exc, EngineDeadError):
        return engine_unavailable(str(exc))
    if isinstance(exc, RequestFailedError):  # this request only: the engine goes on
        return APIError("The server had an error while processing the output of this "
                        "request, and ended it.", status=500, type=SERVER_ERROR,
                        code="request_failed")
    if isinstance(exc, web.HTTPException):
        return _from_http_exception(exc, request)
    logger.exception("unhandled error in %s %s", request.method, request.path)
    return APIError("The server had an error while processing the request.", status=500,
                    type=SERVER_ERROR)


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> APIError:
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
    if exc.status == 404:
        message = f"Invalid URL ({request.method} {request.path})"
        return APIError(message, status=404, type=INVALID_REQUEST, code="unknown_url")
    if exc.status == 405:
        message = f"Method {request.method} is not allowed for {request.path}"
        return APIError(message, status=405, type=INVALID_REQUEST, code="method_not_allowed",
                        headers=headers)
    if exc.status == 413:
        return body_too_large(request.content_length, request.client_max_size,
                              request.headers.get("Content-Encoding"))
    error_type = INVALID_REQUEST if exc.status < 500 else SERVER_ERROR
    return APIError(exc.reason, status=exc.status, type=error_type, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone: there is no one to answer
    except Exception as exc:
        return error_response(from_exception(exc, request))
