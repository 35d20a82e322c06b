"""A real pagedserve server on 127.0.0.1, in a thread with its own event loop.

The server runs exactly as ``pagedserve serve`` runs it (``create_app`` + ``make_runner``,
uvloop), so tests talk to it over TCP with any client, from any event loop, and client
disconnects are real socket closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from aiohttp import web

from pagedserve.server.api import ServerConfig, create_app, make_runner, make_site
from pagedserve.server.api.app import make_health_site
from pagedserve.server.api.config.app_keys import ENGINE_KEY
from pagedserve.server.engine.config.engine_args import EngineArgs

T = TypeVar("T")
_START_TIMEOUT_S = 120.0


class LiveServer:
    def __init__(self, config: ServerConfig, tracing: Any = None) -> None:
        self.config = config
        self.app: web.Application = create_app(config, tracing)
        self._loop = uvloop.new_event_loop()
        self._runner = make_runner(self.app, access_log=None)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> Any:
        return self.app[ENGINE_KEY]

    def start(self) -> LiveServer:
        self._thread.start()
        self.call(self._start, timeout=_START_TIMEOUT_S)
        return self

    async def _start(self) -> None:
        await self._runner.setup()
        site = make_site(self._runner, "127.0.0.1", 0)
        self.site = site
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.health_port = None
        if self.config.health_port is not None:
            self.health_site = make_health_site(self._runner, "127.0.0.1",
                                                self.config.health_port)
            await self.health_site.start()
            self.health_port = self._runner.addresses[1][1]

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
        """Runs ``fn()`` on the server's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    def stop(self) -> None:
        self.call(self._runner.cleanup)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def wait_until(self, predicate: Callable[[Any], bool], timeout: float = 30.0) -> Any:
        """Polls ``engine.stats()`` until ``predicate(stats)``; returns those stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"engine never reached the expected state: {stats}")
            time.sleep(0.01)

    def wait_idle(self, free_tokens: int, timeout: float = 30.0) -> Any:
        """Waits until nothing runs or waits and ``free_tokens`` KV slots are free again."""
        return self.wait_until(
            lambda s: s.num_running == 0 and s.num_waiting == 0
            and s.free_token_capacity == free_tokens,
            timeout,
        )


def server_config(model_dir: str, **overrides: Any) -> ServerConfig:
    """A small test server: the tiny checkpoint, a 64-block KV cache, CPU."""
    engine = {"model": model_dir, "num_kv_blocks": 64, "max_num_seqs": 16,
              "max_num_batched_tokens": 512}
    engine.update(overrides.pop("engine", {}))
    return ServerConfig(engine_args=EngineArgs(**engine), host="127.0.0.1", port=0,
                        served_model_names=["tiny-test"], **overrides)


async def start_serve_process(model_dir: Path, *args: str, env: dict[str, str] | None = None,
                              ) -> tuple[asyncio.subprocess.Process, str]:
    """``pagedserve serve`` on the test checkpoint as a child process (stdout piped), once it
    prints its address; returns the process and its base URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagedserve.cli.main", "serve", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", "0", "--served-model-name", "tiny-test",
        "--num-kv-blocks", "64", "--disable-access-log", *args,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), _START_TIMEOUT_S)).decode()
        if not line:
            raise AssertionError(f"the server exited early: {await process.wait()}")
        if line.startswith("pagedserve: serving on "):
            return process, line.rsplit(" ", 1)[1].strip()
