"""The errors the server and the client share: one request a caller got wrong, and OpenAI's
error object on the wire.

``InvalidRequestError`` is raised by the engine (a request it can never serve) and by the
client (a request it cannot plan for); the server answers it with a 400. ``APIError`` is
OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status: the server
raises one to answer with it, the client raises one (a subclass per failure) for the answer
it got or for the lack of one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PagedServeError(Exception):
    """Base class of every error pagedserve raises on purpose."""


class InvalidRequestError(PagedServeError, ValueError):
    """A request that cannot be served as given (a bad parameter, a prompt too long).

    ``param`` names the offending field, as OpenAI's ``error.param`` does; ``value`` holds
    the rejected value when the raiser names one.
    """

    def __init__(self, message: str, param: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.value = value

    @classmethod
    def expected(cls, param: str, value: object, expected: str) -> InvalidRequestError:
        """``param must be <expected>, got <value>``."""
        return cls(f"{param} must be {expected}, got {value!r}", param, value)


class APIError(PagedServeError):
    """OpenAI's error object and its HTTP status (None when no answer came).

    ``url`` and ``body`` are the client's: the request's address and the body the server
    sent back, as JSON when it parsed. ``close_connection`` is the server's: the rest of the
    connection's bytes cannot be parsed, so it closes after answering.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
        url: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers: Mapping[str, str] = dict(headers or {})
        self.url = url
        self.body = body
        self.close_connection = False

    def error_object(self) -> dict[str, Any]:
        """The JSON body OpenAI's API answers with."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
