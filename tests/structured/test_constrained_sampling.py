"""The promises of constrained decoding under sampling, checked over a few hundred requests
(``benchmarks.structured_property`` runs thousands on the default model): every output that
ends "stop" is whole and valid, every output cut at "length" is a prefix its grammar
accepts, and a seeded request streams the text it gives whole.

The server runs the tiny test model with a 65,536-row vocabulary of which its tokenizer
spells only 384 ids, so nearly every id is one no grammar allows: a sampler that lets a
forbidden token through even once in tens of thousands of draws per row shows here. The
requests run concurrently, with ``n`` up to 3, through a KV cache small enough to preempt,
with prefix caching on; the seeded pairs run afterwards, where nothing is preempted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from benchmarks import structured_property as prop
from pagedserve.kernels import native_build
from tests.api.live_server import LiveServer, server_config
from tests.checkpoints import make_checkpoint
from tests.live_model import VOCAB_SIZE
from tests.tokenizer_files import write_hf_tokenizer

WIDE_VOCAB = 65536
REQUESTS = 200


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_checkpoint(tmp_path_factory.mktemp("wide-vocab"), "llama",
                           vocab_size=WIDE_VOCAB, max_position_embeddings=1024)
    return write_hf_tokenizer(path, VOCAB_SIZE)


@pytest.fixture(scope="module")
def server(wide_model: Path) -> Iterator[LiveServer]:
    # The CPU kernels a server runs by default (the suite's default is the torch reference):
    # their sampling race is what a served request draws from.
    backend = "cpu" if native_build.c_compiler() is not None else "torch"
    engine = {"num_kv_blocks": 40, "max_num_seqs": 16, "max_model_len": 512,
              "enable_prefix_caching": True, "kernel_backend": backend}
    live = LiveServer(server_config(str(wide_model), engine=engine)).start()
    yield live
    live.stop()


async def _check(server: LiveServer) -> prop.Counts:
    trials = prop.plan(REQUESTS, seed=1, max_tokens=40, brief=True)
    async with AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused",
                           max_retries=0) as client:
        counts = await prop.run(client, "tiny-test", trials, concurrency=16)
        preempted = server.engine.stats().num_preemptions
        await prop.run_pairs(client, "tiny-test", trials, concurrency=2, counts=counts)
        assert server.engine.stats().num_preemptions == preempted
    return counts


def test_sampled_constrained_outputs_keep_every_promise(server: LiveServer) -> None:
    counts = asyncio.run(_check(server))
    assert counts.failures == []
    assert counts.requests == REQUESTS
    # The run covered what it claims to: cut outputs, finished ones, pairs, preemption and
    # prefix-cache hits.
    assert counts.stop > 100 and counts.length > 20 and counts.seeded_pairs > 30
    stats = server.engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
