"""The engine split over two worker processes (gloo, CPU) gives the tokens of one rank,
through every memory path: chunked prefill, preemption by recomputation and by swapping,
prefix caching, copy-on-write for parallel samples and beams, seeded sampling, logprobs.

One TP=2 engine and one TP=1 engine with the same settings serve every test of this module:
a small KV pool (48 blocks of 8 tokens) so that requests are preempted both ways, chunked
prefill (48 tokens a step), prefix caching, and a mixed batch of greedy, seeded random,
parallel-sampling and beam-search requests. (One rank equals transformers under these
settings in tests/e2e; two ranks equal transformers in test_tp_families.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pagedserve.cli.startup_log import startup_lines
from pagedserve.server import LLM, BeamSearchParams, SamplingParams
from pagedserve.server.api.config.server_config import ServerConfig
from pagedserve.server.engine.engine_stats import ParallelInfo
from pagedserve.server.engine.parallel.step_message import StepMessage
from tests.e2e.conftest import prompt_token_ids

ENGINE = dict(dtype="float32", skip_tokenizer_init=True, block_size=8, num_kv_blocks=48,
              max_model_len=384, max_num_batched_tokens=48, enable_prefix_caching=True,
              swap_space=0.01)
GREEDY_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
SAMPLED = SamplingParams(n=3, temperature=0.9, top_p=0.95, seed=7, max_tokens=24)
LOGPROBS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, prompt_logprobs=2)
BEAMS = BeamSearchParams(beam_width=3, max_tokens=16).to_sampling_params()


class Recorder:
    """Every step message rank 0 broadcasts, to see which block operations went out."""

    def __init__(self, workers) -> None:
        self.messages: list[StepMessage] = []
        self._send = workers.send

    def __call__(self, message: StepMessage) -> None:
        self.messages.append(message)
        self._send(message)

    def count(self, field: str) -> int:
        return sum(len(getattr(m, field)) for m in self.messages)


@pytest.fixture(scope="module")
def engines(tp_checkpoints: dict[str, Path]) -> Iterator[tuple[LLM, LLM, Recorder]]:
    path = tp_checkpoints["llama"]
    tp1 = LLM(str(path), **ENGINE)
    tp2 = LLM(str(path), tensor_parallel_size=2, **ENGINE)
    workers = tp2.engine.workers
    recorder = Recorder(workers)
    workers.send = recorder
    yield tp1, tp2, recorder
    processes = list(workers._processes.values())
    tp2.engine.shutdown()
    assert [p.exitcode for p in processes] == [0], "workers leave on the shutdown message"


def requests(prompts: list[list[int]]) -> tuple[list[dict], list[SamplingParams]]:
    """The greedy prompts, then two parallel-sampling requests, one with logprobs and one
    beam search; the later arrivals are the ones preempted."""
    extra = [prompts[3], prompts[5], prompts[4], prompts[2]]
    params = [GREEDY] * len(prompts) + [SAMPLED, replace(SAMPLED, seed=8), LOGPROBS, BEAMS]
    return [{"prompt_token_ids": p} for p in prompts + extra], params


def tokens(results) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in results]


PROMPTS = prompt_token_ids(384)  # 8 prompts of 1 to 200 tokens


@pytest.fixture(scope="module")
def mixed(engines):
    tp1, tp2, _ = engines
    prompts, params = requests(PROMPTS)
    return tp1.generate(prompts, params), tp2.generate(prompts, params)


def test_mixed_batch_matches_one_rank(mixed) -> None:
    one, two = mixed
    assert tokens(two) == tokens(one)
    assert [len(r.outputs) for r in two] == [1] * 8 + [3, 3, 1, 3]


def test_logprobs_agree_with_one_rank(mixed) -> None:
    one, two = mixed[0][-2], mixed[1][-2]
    for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True):
        assert a.keys() == b.keys()
        for token in a:
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-4)
            assert b[token].rank == a[token].rank
    assert one.outputs[0].cumulative_logprob == pytest.approx(
        two.outputs[0].cumulative_logprob, abs=1e-4)


def test_both_preemption_modes_ran_and_block_ops_reached_the_workers(engines, mixed) -> None:
    _, tp2, recorder = engines
    stats = tp2.engine.scheduler.preemption_stats
    assert stats.num_recompute > 0, "single-sequence requests are recomputed"
    assert stats.num_swap > 0, "requests with several samples or beams are swapped"
    assert recorder.count("blocks_to_swap_out") > 0
    assert recorder.count("blocks_to_swap_in") > 0
    assert recorder.count("blocks_to_copy") > 0, "forked samples copy their shared last block"
    assert max(m.model_input.input_ids.shape[0] for m in recorder.messages
               if m.model_input is not None) == 48, "long prompts are prefilled in chunks"
    assert tp2.engine.stats().kv_cache_usage == 0.0


def test_prefix_cache_hits_on_every_rank(engines, mixed) -> None:
    tp2 = engines[1]
    again = tp2.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert tokens(again) == tokens(mixed[0][:8])
    assert sum(r.num_cached_tokens for r in again) > 0


def test_each_rank_holds_half_the_kv_bytes(engines) -> None:
    tp1, tp2, _ = engines
    one, two = tp1.engine.parallel_info(), tp2.engine.parallel_info()
    assert one == ParallelInfo(1, 48, one.kv_bytes_per_rank, one.cpu_kv_blocks_per_rank)
    # One of the two KV heads per rank: the same block count at half the bytes per block.
    assert two == ParallelInfo(2, 48, one.kv_bytes_per_rank // 2,
                               2 * one.cpu_kv_blocks_per_rank)
    tp2.engine.check_health()
    # 2 (K, V) x 2 layers x 1 KV head x 16 dims x 8 tokens x 4 bytes = 2048 bytes a block.
    assert ("tensor parallel size: 2; each rank holds 2 of 4 attention heads, 1 of 2 KV "
            "heads, and 48 KV blocks = 98,304 bytes (0.09 MiB) per rank") in startup_lines(
        tp2.engine, ServerConfig(), [])
