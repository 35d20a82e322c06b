"""``pagedserve serve -tp 2`` as a real process: the OpenAI SDK against it, its metrics, and
what becomes of its worker when the server stops or the worker dies."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.cli.serve import EXIT_ENGINE_FAILED
from pagedserve.client.api.sse import iter_sse
from pagedserve.server import LLM, SamplingParams
from tests.live_model import MODEL, write_live_model

NUM_KV_BLOCKS = 64
START_TIMEOUT_S = 120
# Exiting after a failure takes the handlers' grace (2 s) and the cleanup, well within this.
EXIT_BOUND_S = 15
LONG = {"model": MODEL, "prompt": "keep going", "max_tokens": 900, "ignore_eos": True,
        "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("tp-server"))


class Server:
    def __init__(self, process: asyncio.subprocess.Process, base_url: str) -> None:
        self.process = process
        self.base_url = base_url

    def children(self) -> list[int]:
        """Processes whose parent is the server (its worker, multiprocessing's helpers)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _parent(int(entry)) == self.process.pid:
                found.append(int(entry))
        return found

    def worker(self) -> int:
        workers = [pid for pid in self.children() if b"spawn_main" in _cmdline(pid)]
        assert len(workers) == 1, f"expected one spawned worker, found {workers}"
        return workers[0]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still alive after ``timeout`` seconds (none, once they have exited)."""
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return alive


@pytest_asyncio.fixture
async def server(model_dir: Path) -> AsyncIterator[Server]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagedserve.cli.main", "serve", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL,
        "--dtype", "float32", "-tp", "2", "--num-kv-blocks", str(NUM_KV_BLOCKS),
        "--disable-access-log",
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)).decode()
            if not line:
                raise AssertionError(f"the server exited early: {await process.wait()}")
            if line.startswith("pagedserve: serving on "):
                break
        yield Server(process, line.rsplit(" ", 1)[1].strip())
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def gauges(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    async with session.get(base_url + "/metrics") as response:
        text = await response.text()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if family.type == "gauge"}


@pytest.mark.slow
async def test_openai_sdk_against_two_ranks_and_a_killed_worker(server: Server,
                                                                model_dir: Path) -> None:
    offline = LLM(str(model_dir), dtype="float32", num_kv_blocks=NUM_KV_BLOCKS)
    expected = offline.generate("The paged KV cache", SamplingParams(temperature=0,
                                                                     max_tokens=12))
    async with AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused",
                           max_retries=0) as client:
        completion = await client.completions.create(
            model=MODEL, prompt="The paged KV cache", max_tokens=12, temperature=0)
        assert completion.choices[0].text == expected[0].outputs[0].text
        assert completion.usage.completion_tokens == len(expected[0].outputs[0].token_ids)
        stream = await client.completions.create(
            model=MODEL, prompt="The paged KV cache", max_tokens=12, temperature=0,
            stream=True)
        assert "".join([c.choices[0].text async for c in stream]) == (
            completion.choices[0].text)
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
            temperature=0, extra_body={"ignore_eos": True})
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage.completion_tokens == 5

    children = server.children()
    worker = server.worker()
    async with aiohttp.ClientSession() as session:
        metrics = await gauges(session, server.base_url)
        assert metrics["pagedserve:tensor_parallel_size"] == 2
        assert metrics["pagedserve:kv_cache_blocks_per_rank"] == NUM_KV_BLOCKS

        stream = await session.post(server.base_url + "/v1/completions", json=LONG)
        events = iter_sse(stream.content)
        assert (await anext(events)).json()["choices"][0]["finish_reason"] is None
        os.kill(worker, signal.SIGKILL)
        rest = [event async for event in events]
        assert rest[-1].is_done
        error = rest[-2].json()["error"]
        assert error["code"] == "engine_dead"
        assert (f"tensor-parallel worker rank 1 (pid {worker}) was killed by signal SIGKILL"
                in error["message"])
        failed_at = time.monotonic()
        try:
            async with session.get(server.base_url + "/health") as health:
                assert health.status == 503
        except aiohttp.ClientConnectionError:
            pass  # already gone: as good as a 503 to a load balancer
    # The engine failed: the server exits by itself, non-zero, for a supervisor to restart it.
    assert await asyncio.wait_for(server.process.wait(), EXIT_BOUND_S) == EXIT_ENGINE_FAILED
    assert time.monotonic() - failed_at < EXIT_BOUND_S
    assert await wait_gone(children) == []


@pytest.mark.slow
async def test_sigterm_stops_the_server_and_its_worker(server: Server) -> None:
    children = server.children()
    worker = server.worker()
    server.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(server.process.wait(), 60) == 0
    assert await wait_gone(children) == [], f"left behind: worker {worker}, all {children}"
