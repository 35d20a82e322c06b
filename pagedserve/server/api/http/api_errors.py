"""OpenAI-shaped errors: one exception type, one middleware that turns everything into JSON.

Handlers raise; only ``error_middleware`` builds error responses, so every failure a client
can see (bad JSON, unknown route, oversized body, engine errors) has the same body:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import logging
import math

from aiohttp import web
from aiohttp.typedefs import Handler

from pagedserve.common.engine_errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
)
from pagedserve.common.errors import APIError
from pagedserve.common.http.json_errors import (
    INVALID_REQUEST,
    RATE_LIMIT,
    SERVER_ERROR,
    UNAVAILABLE,
    body_too_large,
    error_response,
    from_http_exception,
)

logger = logging.getLogger(__name__)

# The shapes every HTTP front shares, named here too for the server's modules.
__all__ = ["INVALID_REQUEST", "RATE_LIMIT", "SERVER_ERROR", "UNAVAILABLE", "APIError",
           "body_too_large", "error_response"]


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


def engine_stalled(seconds: float, limit: float) -> APIError:
    return APIError(f"The engine has not finished a step in {seconds:.0f} s while it holds "
                    f"requests (--engine-stall-timeout {limit:g} s).", status=503,
                    type=UNAVAILABLE, code="engine_stalled")


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
        return from_http_exception(exc, request)
    logger.exception("unhandled error in %s %s", request.method, request.path)
    return APIError("The server had an error while processing the request.", status=500,
                    type=SERVER_ERROR)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client is gone: there is no one to answer
    except Exception as exc:
        return error_response(from_exception(exc, request))
