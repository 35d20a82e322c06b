"""The router's own refusals, in OpenAI's error shape (the replicas' errors pass through)."""

from __future__ import annotations

from aiohttp import web

from pagedserve.common.errors import APIError
from pagedserve.common.http.json_errors import INVALID_REQUEST, UNAVAILABLE, error_response

# How long a client should wait before retrying a request the router could not place.
RETRY_AFTER_S = 1
_RETRY_AFTER = {"Retry-After": str(RETRY_AFTER_S)}


def no_replica() -> web.Response:
    return error_response(APIError("No healthy replica is available.", status=503,
                                   type=UNAVAILABLE, code="no_healthy_replica",
                                   headers=_RETRY_AFTER))


def upstream_failed(attempts: int, detail: str) -> web.Response:
    return error_response(APIError(f"Every replica tried ({attempts}) failed: {detail}",
                                   status=502, type=UNAVAILABLE, code="upstream_failed",
                                   headers=_RETRY_AFTER))


def overloaded(limit: int) -> web.Response:
    return error_response(APIError(f"The router has {limit} requests in flight, its limit.",
                                   status=503, type=UNAVAILABLE, code="router_overloaded",
                                   headers=_RETRY_AFTER))


def invalid_json(detail: str) -> web.Response:
    return error_response(APIError(f"The request body is not valid JSON: {detail}",
                                   status=400, type=INVALID_REQUEST, code="invalid_json"))


def not_an_object() -> web.Response:
    return error_response(APIError("The request body must be a JSON object.", status=400,
                                   type=INVALID_REQUEST, code="invalid_json"))

