"""Liveness in both directions: rank 0 watches the worker processes it spawned, and each
spawned worker watches its parent, so that neither side outlives the other for long."""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

logger = logging.getLogger(__name__)

_POLL_S = 0.5


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


class WorkerWatchdog:
    """A daemon thread that calls ``on_exit(rank, process)`` once, for the first worker that
    exits before ``stop()`` is called. ``on_exit`` is held weakly (a ``WeakMethod``), so the
    thread does not keep the engine alive."""

    def __init__(self, processes: dict[int, BaseProcess],
                 on_exit: weakref.WeakMethod[Callable[[int, BaseProcess], None]]) -> None:
        self._processes = processes
        self._on_exit = on_exit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagedserve-tp-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        by_sentinel = {p.sentinel: (rank, p) for rank, p in self._processes.items()}
        while not self._stopped.is_set():
            ready = wait(list(by_sentinel), timeout=_POLL_S)
            if ready and not self._stopped.is_set():
                sentinel = ready[0]  # one of what it was given: the processes' sentinels
                assert isinstance(sentinel, int)
                rank, process = by_sentinel[sentinel]
                process.join(timeout=_POLL_S)
                callback = self._on_exit()
                if callback is not None:
                    callback(rank, process)
                return


def watch_parent(parent_pid: int) -> None:
    """Ends this process when its parent is gone (it then belongs to init or a subreaper):
    a worker must not outlive the engine that drives it, whatever killed the engine."""

    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                logger.error("tensor-parallel worker %d: the engine process %d is gone, "
                             "exiting", os.getpid(), parent_pid)
                os._exit(1)
            threading.Event().wait(_POLL_S)

    threading.Thread(target=run, name="pagedserve-parent-watch", daemon=True).start()
