"""A request that aiohttp's HTTP parser rejects (a malformed request line or header, a line
past the size limit, a bad chunk) answered as every other error is: an OpenAI-shaped JSON
400, not aiohttp's plain text.

The parser's messages quote the bytes they choked on (up to 8 KiB of them); the answer and
the log name only the problem, so no client can make the server echo or log its input.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from pagedserve.common.errors import APIError
from pagedserve.common.http.json_errors import INVALID_REQUEST, error_response

# A problem's description is cut here (the pure-Python parser has no line of its own for it).
_MAX_DETAIL_CHARS = 120


def describe(exc: HttpProcessingError) -> str:
    """What was wrong, without the bytes the parser quotes: the lines of its message before
    the quoted input (``Invalid header token``, ``Bad status line: Invalid HTTP version``)."""
    if isinstance(exc, LineTooLong):
        return f"a request line or header is longer than {exc.args[1]} bytes"
    problem = []
    for line in exc.message.splitlines():
        line = line.strip()
        if line.startswith(("b'", 'b"', "bytearray(", "^")):
            break
        if line:
            problem.append(line.rstrip(":"))
    detail = ": ".join(problem) or type(exc).__name__
    return detail if len(detail) <= _MAX_DETAIL_CHARS else detail[:_MAX_DETAIL_CHARS] + "..."


class JSONParseErrors(RequestHandler):
    """aiohttp's connection handler, answering its parser's rejections in JSON."""

    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own handling still logs (through ServerLog) and checks that nothing was
        # sent yet; only its plain-text body is replaced.
        response = super().handle_error(request, status, exc, message)
        if not isinstance(exc, HttpProcessingError):
            return response
        error = APIError(f"The request could not be parsed as HTTP: {describe(exc)}.",
                         status=400, type=INVALID_REQUEST)
        error.close_connection = True
        return error_response(error)


def json_parse_errors(server: Callable[[], RequestHandler]) -> Callable[[], RequestHandler]:
    """A protocol factory like ``server`` (the runner's ``web.Server``) whose connection
    handlers answer parser rejections with ``JSONParseErrors``."""

    def factory() -> RequestHandler:
        handler = server()
        # The subclass adds no state (empty __slots__), so the instance can take its class.
        handler.__class__ = JSONParseErrors
        return handler

    return factory
