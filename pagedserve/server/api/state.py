"""The application's shared state, under typed keys (no module-level singletons)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aiohttp import web

from pagedserve.server.api.admission import Admission
from pagedserve.server.api.config import ServerConfig
from pagedserve.server.api.metrics import ServerMetrics
from pagedserve.server.api.server_log import ServerLog

if TYPE_CHECKING:
    from pagedserve.server.api.generation import GenerationBatch
    from pagedserve.server.api.tracing import ServerTracing
    from pagedserve.server.engine.async_engine import AsyncEngine

CONFIG_KEY = web.AppKey("config", ServerConfig)
# The names a request's ``model`` may take; the first is the one responses carry.
MODEL_NAMES_KEY = web.AppKey("model_names", list[str])
ENGINE_KEY: web.AppKey[AsyncEngine] = web.AppKey("engine")
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
# Present only when tracing is on (``ServerTracing``; its module loads OpenTelemetry lazily).
TRACING_KEY: web.AppKey[ServerTracing] = web.AppKey("tracing")
# Unix time the engine came up: the ``created`` of the model cards.
STARTED_KEY = web.AppKey("started", int)
ADMISSION_KEY = web.AppKey("admission", Admission)
# Generations in flight, so that a shutdown past its drain timeout can end them.
BATCHES_KEY: web.AppKey[set[GenerationBatch]] = web.AppKey("batches")
# The threads that tokenize large inputs off the event loop.
TOKENIZER_POOL_KEY = web.AppKey("tokenizer_pool", ThreadPoolExecutor)
# What aiohttp's connection handlers log to (requests the HTTP parser rejects, rate-limited).
SERVER_LOG_KEY = web.AppKey("server_log", ServerLog)
