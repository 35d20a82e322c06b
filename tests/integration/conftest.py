"""One live pagedserve server for the client and load-generator tests, its checkpoint, the
offline engine on the same checkpoint (the oracle for greedy text), and a step observer
that records how many requests the server held at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from pagedserve.client import AsyncClient
from pagedserve.server import LLM
from pagedserve.server.engine.engine_stats import StepStats
from tests.api.live_server import LiveServer, server_config
from tests.live_model import write_live_model

# Short enough that a request asking for a few hundred tokens is refused with a 400 while
# its reservation still fits a small client budget.
MAX_MODEL_LEN = 256
NUM_KV_BLOCKS = 64
BLOCK_SIZE = 16
MAX_NUM_SEQS = 16


class PeakLoad:
    """The most requests the engine held (running, waiting, or finishing) in one step since
    the last ``reset``; a step's finished requests count, since they ran in it."""

    def __init__(self) -> None:
        self.value = 0

    def observe(self, stats: StepStats) -> None:
        held = stats.num_running + stats.num_waiting + len(stats.finished)
        self.value = max(self.value, held)

    def reset(self) -> None:
        self.value = 0


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("integration-llama"))


@pytest.fixture(scope="session")
def peak_load() -> PeakLoad:
    return PeakLoad()


@pytest.fixture(scope="session")
def server(model_dir: Path, peak_load: PeakLoad) -> Iterator[LiveServer]:
    engine = {"max_model_len": MAX_MODEL_LEN, "num_kv_blocks": NUM_KV_BLOCKS,
              "block_size": BLOCK_SIZE, "max_num_seqs": MAX_NUM_SEQS}
    live = LiveServer(server_config(str(model_dir), engine=engine))
    live.start()
    live.engine.add_step_observer(peak_load.observe)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def offline(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=NUM_KV_BLOCKS)


@pytest_asyncio.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.base_url, max_retries=0) as live_client:
        yield live_client
