"""OpenAI's error object as an HTTP response, and the refusals every HTTP front of ours
makes in the same words: the server's and the router's clients see one shape,
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import orjson
from aiohttp import web

from pagedserve.common.errors import APIError

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


def body_read_timeout(timeout: float) -> APIError:
    """408 for a request whose body did not arrive in time (a client trickling it)."""
    error = APIError(f"The request body did not arrive within {timeout:g} s.", status=408,
                     type=INVALID_REQUEST, code="request_timeout")
    error.close_connection = True  # the rest of the body may still come: not parseable
    return error


def unknown_url(method: str, path: str) -> APIError:
    return APIError(f"Invalid URL ({method} {path})", status=404, type=INVALID_REQUEST,
                    code="unknown_url")


def method_not_allowed(method: str, path: str, allow: str | None) -> APIError:
    return APIError(f"Method {method} is not allowed for {path}", status=405,
                    type=INVALID_REQUEST, code="method_not_allowed",
                    headers={"Allow": allow} if allow else None)


def from_http_exception(exc: web.HTTPException, request: web.Request) -> APIError:
    """aiohttp's own refusals (no route, wrong method, body over ``client_max_size``) in
    OpenAI's shape."""
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
    if exc.status == 404:
        return unknown_url(request.method, request.path)
    if exc.status == 405:
        return method_not_allowed(request.method, request.path, headers.get("Allow"))
    if exc.status == 413:
        return body_too_large(request.content_length, request.client_max_size,
                              request.headers.get("Content-Encoding"))
    error_type = INVALID_REQUEST if exc.status < 500 else SERVER_ERROR
    return APIError(exc.reason, status=exc.status, type=error_type, headers=headers)
