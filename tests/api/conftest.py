"""One tiny Llama checkpoint (with a trained BPE tokenizer and a ChatML template) and one
server on it, shared by the API tests; tests that need other settings start their own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from tests.api.live_server import LiveServer, server_config
from tests.checkpoints import make_checkpoint
from tests.live_model import MODEL as MODEL
from tests.live_model import VOCAB_SIZE, write_live_model
from tests.tokenizer_files import write_hf_tokenizer

MAX_BODY_BYTES = 64 * 1024


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("api-llama"))


@pytest.fixture(scope="session")
def server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir), max_request_body_bytes=MAX_BODY_BYTES))
    live.start()
    yield live
    live.stop()


@pytest_asyncio.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused",
                           max_retries=0) as openai_client:
        yield openai_client


@pytest.fixture(scope="session")
def untemplated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint without a chat template, so that the default, tools-aware one renders
    (the tool-calling tests')."""
    path = make_checkpoint(tmp_path_factory.mktemp("tools-llama"), "llama",
                           vocab_size=VOCAB_SIZE, max_position_embeddings=2048)
    return write_hf_tokenizer(path, VOCAB_SIZE, chat_template=None)


@pytest.fixture(scope="session")
def tools_server(untemplated_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(untemplated_dir), engine={"num_kv_blocks": 256})).start()
    yield live
    live.stop()
