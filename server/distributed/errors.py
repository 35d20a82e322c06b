"""The error a failed tensor-parallel rank surfaces as."""

from __future__ import annotations

from pagedserve.server.errors import EngineDeadError


class WorkerFailedError(EngineDeadError):
    """A tensor-parallel worker died, hung past the collective timeout or failed to start.
    The model is split across the ranks, so no step can run without it: the engine is dead
    and its process should exit for a supervisor to restart it."""
