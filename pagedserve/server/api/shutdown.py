"""Graceful shutdown: refuse new work, let what runs finish, then end the stragglers; and
the way out when the engine fails."""

from __future__ import annotations

import logging

from aiohttp import web

from pagedserve.server.api.config.app_keys import ENGINE_KEY
from pagedserve.server.api.http.admission import ADMISSION_KEY
from pagedserve.server.api.http.api_errors import shutting_down
from pagedserve.server.api.serving.generation import BATCHES_KEY

logger = logging.getLogger(__name__)

# After the stragglers are aborted, how long their handlers get to send the error.
_ABORT_GRACE_S = 5.0


async def drain(app: web.Application, timeout: float) -> bool:
    """Stops admitting requests (503) and waits up to ``timeout`` seconds for the admitted
    ones; past it, aborts their engine requests so each client gets a 503 error.

    Returns True when everything finished within the timeout.
    """
    admission = app[ADMISSION_KEY]
    admission.draining = True
    logger.info("draining: %d request(s) in flight, waiting up to %.1f s",
                admission.in_flight, timeout)
    if await admission.wait_idle(timeout):
        return True
    active = app[BATCHES_KEY]
    batches = list(active)
    logger.warning("drain timeout: aborting %d generation(s)", len(batches))
    for batch in batches:
        batch.interrupt(shutting_down())
    await admission.wait_idle(_ABORT_GRACE_S)
    return False


async def wait_engine_failure(app: web.Application) -> BaseException:
    """Returns what stopped the engine's step loop, once it has stopped on a failure."""
    return await app[ENGINE_KEY].wait_failure()


def engine_failure(app: web.Application) -> BaseException | None:
    return app[ENGINE_KEY].failure if ENGINE_KEY in app else None


async def settle_after_failure(app: web.Application, grace: float) -> bool:
    """After the engine failed, gives the handlers in flight (whose requests already carry
    the error, while new ones get 503 ``engine_dead``) up to ``grace`` seconds to send it.

    Returns True when every handler finished within ``grace``.
    """
    return await app[ADMISSION_KEY].wait_idle(grace)
