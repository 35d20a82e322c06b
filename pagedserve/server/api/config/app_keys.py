"""The application's shared state that every room reads, under typed keys (no module-level
singletons). A room's own state sits under a key beside its type (``ADMISSION_KEY`` in
``admission.py``, ``METRICS_KEY`` in ``metrics.py``, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from pagedserve.server.api.config.server_config import ServerConfig

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import AsyncEngine

CONFIG_KEY = web.AppKey("config", ServerConfig)
# The names a request's ``model`` may take; the first is the one responses carry.
MODEL_NAMES_KEY = web.AppKey("model_names", list[str])
ENGINE_KEY: web.AppKey[AsyncEngine] = web.AppKey("engine")
# Unix time the engine came up: the ``created`` of the model cards.
STARTED_KEY = web.AppKey("started", int)
