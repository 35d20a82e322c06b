"""The small GET routes: models, health, version, metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pagedserve.server.api.config.app_keys import CONFIG_KEY, STARTED_KEY
from pagedserve.server.api.http.admission import ADMISSION_KEY
from pagedserve.server.api.http.api_errors import (
    engine_stalled,
    engine_unavailable,
    model_not_found,
    shutting_down,
)
from pagedserve.server.api.http.jsonio import json_response
from pagedserve.server.api.serving.pipeline import VERSION, Serving
from pagedserve.server.api.telemetry.metrics import METRICS_KEY

_OWNER = "pagedserve"


def _model_card(request: web.Request, name: str) -> dict[str, object]:
    serving = Serving.of(request)
    return {
        "id": name,
        "object": "model",
        "created": request.app[STARTED_KEY],
        "owned_by": _OWNER,
        "root": serving.engine.model_name,
        "max_model_len": serving.engine.max_model_len,
    }


async def list_models(request: web.Request) -> web.Response:
    names = Serving.of(request).model_names
    return json_response({"object": "list", "data": [_model_card(request, n) for n in names]})


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    if name not in Serving.of(request).model_names:
        raise model_not_found(name)
    return json_response(_model_card(request, name))


async def health(request: web.Request) -> web.Response:
    """200 only while the engine's loop runs, has not stalled, and the server takes
    requests."""
    if request.app[ADMISSION_KEY].draining:
        raise shutting_down()
    engine = Serving.of(request).engine
    if not engine.is_healthy:
        raise engine_unavailable("the step loop has stopped")
    stalled, limit = engine.stalled_for(), request.app[CONFIG_KEY].engine_stall_timeout
    if stalled > limit:
        raise engine_stalled(stalled, limit)
    return json_response({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    return json_response({"version": VERSION})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
