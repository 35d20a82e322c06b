"""The page's routes: ``/`` and its files under ``/ui/``, and ``/engine/state``.

The files are the ones in ``static/`` when the app is built, served by name; any other name
is the API's 404. The room imports nothing else of the API: the app factory hands it the
engine's snapshot and the model's name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from pagedserve.common.http.static_page import add_static_page
from pagedserve.server.api.web.engine_state import state_body
from pagedserve.server.api.web.paths import STATE_PATH

if TYPE_CHECKING:
    from pagedserve.server.engine.engine_snapshot import EngineSnapshot

STATIC_DIR = Path(__file__).parent / "static"


def add_web_ui(router: web.UrlDispatcher, snapshot: Callable[[], EngineSnapshot],
               model_name: str) -> None:
    """Adds the page's routes; ``snapshot()`` returns the engine's latest snapshot."""
    add_static_page(router, STATIC_DIR)

    async def engine_state(request: web.Request) -> web.Response:
        body = orjson.dumps(state_body(snapshot(), model_name))
        return web.Response(body=body, content_type="application/json")

    router.add_get(STATE_PATH, engine_state)
