"""The router's own refusals, in OpenAI's error shape (the replicas' errors pass through)."""

from __future__ import annotations

import orjson
from aiohttp import web

from pagedserve.common.errors import APIError

UNAVAILABLE = "service_unavailable_error"
INVALID_REQUEST = "invalid_request_error"
# How long a client should wait before retrying a request the router could not place.
RETRY_AFTER_S = 1


def error_response(status: int, message: str, type_: str, code: str,
                   retry_after: bool = False,
                   headers: dict[str, str] | None = None) -> web.Response:
    body = APIError(message, status=status, type=type_, code=code).error_object()
    headers = dict(headers or {})
    if retry_after:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return web.Response(status=status, body=orjson.dumps(body),
                        content_type="application/json", headers=headers)


def no_replica() -> web.Response:
    return error_response(503, "No healthy replica is available.", UNAVAILABLE,
                          "no_healthy_replica", retry_after=True)


def upstream_failed(attempts: int, detail: str) -> web.Response:
    return error_response(502, f"Every replica tried ({attempts}) failed: {detail}",
                          UNAVAILABLE, "upstream_failed", retry_after=True)


def overloaded(limit: int) -> web.Response:
    return error_response(503, f"The router has {limit} requests in flight, its limit.",
                          UNAVAILABLE, "router_overloaded", retry_after=True)


def invalid_json(detail: str) -> web.Response:
    return error_response(400, f"The request body is not valid JSON: {detail}",
                          INVALID_REQUEST, "invalid_json")


def not_an_object() -> web.Response:
    return error_response(400, "The request body must be a JSON object.", INVALID_REQUEST,
                          "invalid_json")


def body_too_large(limit: int) -> web.Response:
    return error_response(413, f"Request body too large: the limit is {limit} bytes.",
                          INVALID_REQUEST, "request_too_large")


def not_found(method: str, path: str) -> web.Response:
    return error_response(404, f"Invalid URL ({method} {path})", INVALID_REQUEST,
                          "unknown_url")
