"""An access log that leaves out the page's own traffic: its files, and the state it polls
four times a second, which would otherwise drown every other line."""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_log import AccessLogger

from pagedserve.server.api.web.paths import STATE_PATH, is_page_path


class PageQuietAccessLogger(AccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if response.status < 400 and (request.path == STATE_PATH or is_page_path(request.path)):
            return
        super().log(request, response, time)
