"""``pagedserve bench`` end to end against a live server: the totals in its result JSON are
the server's own Prometheus counters, moved by exactly this run.

Prompt lengths are measured with ``cl100k_base`` (the load generator's default), while the
server counts with its own small BPE, so the input total is the server's count of the very
prompts the seeded dataset holds.
"""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from collections import Counter
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.loadgen.cli import add_arguments, run
from pagedserve.loadgen.datasets import DatasetSpec, load_dataset
from pagedserve.loadgen.hf_tokenizer import HFTokenizerCounter
from pagedserve.loadgen.tokenizers import TiktokenCounter
from tests.api.live_server import LiveServer
from tests.integration.conftest import BLOCK_SIZE, NUM_KV_BLOCKS
from tests.live_model import MODEL

NUM_PROMPTS = 20
INPUT_LEN = 16
OUTPUT_LEN = 8
SEED = 7
# Four requests of ~100 server tokens hold well under the 64-block cache: no preemption.
MAX_CONCURRENCY = 4
SUCCESS = "vllm:request_success_total"


def scrape(server: LiveServer) -> Counter[tuple[str, str]]:
    """Every counter sample of ``/metrics`` by (sample name, finish reason or "")."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    values: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                values[sample.name, sample.labels.get("finished_reason", "")] += sample.value
    return values


def bench_args(server: LiveServer, result_path: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedserve bench")
    add_arguments(parser)
    return parser.parse_args([
        "--base-url", server.base_url, "--model", MODEL, "--dataset-name", "random",
        "--num-prompts", str(NUM_PROMPTS), "--random-input-len", str(INPUT_LEN),
        "--random-output-len", str(OUTPUT_LEN), "--seed", str(SEED), "--ignore-eos",
        "--max-concurrency", str(MAX_CONCURRENCY), "--disable-tqdm",
        "--result-json", str(result_path),
    ])


def server_prompt_tokens(server: LiveServer) -> int:
    """The server tokenizer's count of every prompt of the run's dataset."""
    spec = DatasetSpec(name="random", random_input_len=INPUT_LEN,
                       random_output_len=OUTPUT_LEN, seed=SEED)
    samples = asyncio.run(load_dataset(spec, NUM_PROMPTS, TiktokenCounter()))
    assert [s.prompt_len for s in samples] == [INPUT_LEN] * NUM_PROMPTS
    return sum(len(server.engine.tokenizer.encode(s.prompt)) for s in samples)


def test_bench_totals_equal_the_servers_counters(server: LiveServer, tmp_path: Path) -> None:
    server.wait_idle(NUM_KV_BLOCKS * BLOCK_SIZE)  # nothing left over from other tests
    result_path = tmp_path / "result.json"
    args = bench_args(server, result_path)
    before = scrape(server)
    assert run(args) == 0
    after = scrape(server)
    delta = {key: after[key] - before[key] for key in after}
    result = orjson.loads(result_path.read_bytes())

    assert (result["completed"], result["failed"]) == (NUM_PROMPTS, 0)
    assert result["total_input_tokens"] == server_prompt_tokens(server)
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert result["output_tokens_from_usage"] == NUM_PROMPTS
    # Each prompt is counted once, when its first token is out (vLLM's meaning).
    assert delta["vllm:num_preemptions_total", ""] == 0
    assert delta["vllm:prompt_tokens_total", ""] == result["total_input_tokens"]
    assert delta["vllm:generation_tokens_total", ""] == result["total_output_tokens"]
    successes = {reason: n for (name, reason), n in delta.items() if name == SUCCESS and n}
    assert successes == {"length": result["completed"]}


def _vllm_command(server: LiveServer, model_dir: Path, result_path: Path,
                  *extra: str) -> argparse.Namespace:
    """A ``vllm bench serve`` command line, as its users write it, after its first words."""
    parser = argparse.ArgumentParser(prog="pagedserve bench")
    add_arguments(parser)
    return parser.parse_args([
        "--backend", "vllm", "--base-url", server.base_url + "/v1",
        "--endpoint", "/v1/completions", "--model", str(model_dir),
        "--served-model-name", MODEL, "--tokenizer", str(model_dir), "--tokenizer-mode", "auto",
        "--trust-remote-code", "--dataset-name", "sonnet", "--sonnet-input-len", "160",
        "--sonnet-prefix-len", "60", "--sonnet-output-len", "4", "--num-prompts", "4",
        "--ignore-eos", "--disable-tqdm", "--result-json", str(result_path), *extra,
    ])


def test_a_vllm_sonnet_command_line_counts_what_the_server_counts(
        server: LiveServer, model_dir: Path, tmp_path: Path) -> None:
    server.wait_idle(NUM_KV_BLOCKS * BLOCK_SIZE)
    path = tmp_path / "sonnet.json"
    assert run(_vllm_command(server, model_dir, path, "--max-concurrency", "4")) == 0
    result = orjson.loads(path.read_bytes())
    assert (result["completed"], result["failed"]) == (4, 0)
    # The chat-formatted sonnet prompts, counted with the model's own tokenizer directory,
    # are exactly what the server reports as prompt tokens.
    spec = DatasetSpec(name="sonnet", sonnet_input_len=160, sonnet_prefix_len=60,
                       sonnet_output_len=4)
    samples = asyncio.run(load_dataset(spec, 4, HFTokenizerCounter(str(model_dir))))
    assert all(s.prompt.startswith("<|im_start|>user\n") for s in samples)
    assert result["total_input_tokens"] == sum(s.prompt_len for s in samples)
    assert result["total_output_tokens"] == 4 * 4


def test_beam_search_runs_unstreamed_against_the_server(
        server: LiveServer, model_dir: Path, tmp_path: Path) -> None:
    server.wait_idle(NUM_KV_BLOCKS * BLOCK_SIZE)
    path = tmp_path / "beams.json"
    args = _vllm_command(server, model_dir, path, "--use-beam-search", "--best-of", "2",
                         "--num-prompts", "2")
    assert run(args) == 0
    result = orjson.loads(path.read_bytes())
    assert (result["completed"], result["failed"], result["streamed"]) == (2, 0, False)
    assert result["mean_ttft_ms"] is None and result["mean_e2el_ms"] > 0
