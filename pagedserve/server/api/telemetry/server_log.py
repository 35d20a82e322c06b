"""The log that aiohttp's connection handler writes to, with requests its HTTP parser
rejects logged as one rate-limited WARNING line each.

aiohttp logs a request it cannot parse at ERROR with the whole traceback: a dozen lines that
any client can make the server write as fast as it can send bytes. Such a request is the
client's error, not the server's: one short line (the client's address, what was wrong) is
enough (``parse_errors.describe``: the problem, not the bytes the parser quotes), and past one
line per ``interval_s`` the rest are only counted, and the count told with the next line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from pagedserve.common.http.parse_errors import describe


class ServerLog:
    """A stand-in for aiohttp's ``server_logger`` (``make_runner`` passes it as ``logger``)."""

    def __init__(self, logger: logging.Logger | None = None, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger or logging.getLogger("aiohttp.server")
        self.interval_s = interval_s
        self._clock = clock
        self._next_line_at: float | None = None
        self.num_suppressed = 0

    def debug(self, *args: Any, **kwargs: Any) -> None:
        self.logger.debug(*args, **kwargs)

    def warning(self, *args: Any, **kwargs: Any) -> None:
        self.logger.warning(*args, **kwargs)

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._rejected(args[0] if args else None, exc_info)
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)

    def _rejected(self, remote: object, exc: HttpProcessingError) -> None:
        now = self._clock()
        if self._next_line_at is not None and now < self._next_line_at:
            self.num_suppressed += 1
            return
        self._next_line_at = now + self.interval_s
        # One line, and repr: none of the client's bytes reach the log raw.
        detail = repr(" ".join(describe(exc).split()))
        more = (f" ({self.num_suppressed} more since the last such line)"
                if self.num_suppressed else "")
        self.num_suppressed = 0
        self.logger.warning("rejected a malformed HTTP request from %s: %s %s%s", remote,
                            type(exc).__name__, detail, more)


# What aiohttp's connection handlers log to (requests the HTTP parser rejects, rate-limited).
SERVER_LOG_KEY = web.AppKey("server_log", ServerLog)
