"""Seeded reproducibility, best_of ranking, aborts, request metrics, the embedded tiny model
and the `pagedserve generate` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pagedserve.server import LLM, SamplingParams


def test_seeded_sampling_is_reproducible_across_batches(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    llm = LLM(str(model_dir), dtype="float32")
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=42, max_tokens=24)
    alone = llm.generate({"prompt_token_ids": prompts[4]}, params)[0].outputs[0].token_ids
    # The same request inside a batch of other random requests, unseeded ones included.
    batch = [{"prompt_token_ids": p} for p in prompts]
    mixed = [SamplingParams(temperature=1.0, max_tokens=24) for _ in prompts]
    mixed[4] = params
    together = llm.generate(batch, mixed)[4].outputs[0].token_ids
    assert alone == together
    other = SamplingParams(temperature=0.9, top_p=0.9, seed=43, max_tokens=24)
    assert llm.generate({"prompt_token_ids": prompts[4]}, other)[0].outputs[0].token_ids != alone


def test_best_of_returns_the_n_most_likely_samples(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    llm = LLM(str(model_dir), dtype="float32")
    result = llm.generate({"prompt_token_ids": prompts[2]},
                          SamplingParams(n=2, best_of=5, seed=1, temperature=1.0,
                                         max_tokens=8))[0]
    every = llm.generate({"prompt_token_ids": prompts[2]},
                         SamplingParams(n=5, seed=1, temperature=1.0, max_tokens=8,
                                        logprobs=0))[0]
    ranked = sorted(every.outputs, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
    assert [c.token_ids for c in result.outputs] == [c.token_ids for c in ranked]
    assert [c.index for c in result.outputs] == [0, 1]


def test_abort_mid_generation_frees_every_block(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    llm = LLM(str(model_dir), dtype="float32", block_size=8)
    engine = llm.engine
    free_before = engine.stats().free_token_capacity
    engine.add_request("a", prompts[7], SamplingParams(max_tokens=50, n=3, seed=0,
                                                       temperature=1.0))
    engine.add_request("b", prompts[6], SamplingParams(max_tokens=50))
    engine.add_request("c", prompts[5], SamplingParams(max_tokens=50))
    for _ in range(4):
        engine.step()
    assert engine.stats().free_token_capacity < free_before
    final = engine.abort_request("a")
    assert final.finished and {c.finish_reason for c in final.outputs} == {"abort"}
    assert len(final.outputs) == 3 and all(len(c.token_ids) >= 1 for c in final.outputs)
    assert engine.abort_request("a") is None  # idempotent
    engine.abort_request("b")
    engine.abort_request("c")
    assert not engine.has_unfinished_requests()
    assert engine.stats().free_token_capacity == free_before
    engine.scheduler.check_integrity()


def test_request_metrics_are_ordered(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    llm = LLM(str(model_dir), dtype="float32")
    result = llm.generate({"prompt_token_ids": prompts[3]}, SamplingParams(max_tokens=4))[0]
    m = result.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time \
        <= m.last_token_time <= m.finished_time
    assert m.queue_time >= 0 and m.time_to_first_token >= m.queue_time


def test_tiny_model_generates_text_with_cl100k(tmp_path: Path) -> None:
    llm = LLM("tiny", dtype="float32", max_model_len=256)
    result = llm.generate("The paged KV cache", SamplingParams(temperature=0.0, max_tokens=6))[0]
    tokenizer = llm.get_tokenizer()
    assert result.prompt_token_ids == tokenizer.encode("The paged KV cache")
    assert len(result.outputs[0].token_ids) == 6
    assert result.outputs[0].text == tokenizer.decode(result.outputs[0].token_ids)


def test_generate_command(llama_case: tuple) -> None:
    model_dir = llama_case[0]
    done = subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.main", "generate", "hello there",
         "--model", str(model_dir), "--dtype", "float32", "--max-tokens", "5"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "'hello there' -> " in done.stdout and "[5 tokens, finish_reason=length]" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.main", "generate", "x", "--model",
         str(model_dir), "--max-tokens", "100000"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2
    assert "maximum context length is 512 tokens" in bad.stderr


def test_engine_seed_makes_unseeded_sampling_repeat(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    batch = [{"prompt_token_ids": p} for p in prompts[:3]]
    params = SamplingParams(temperature=1.0, max_tokens=12)

    def fresh(seed: int) -> list[list[int]]:
        llm = LLM(str(model_dir), dtype="float32", seed=seed)
        return [r.outputs[0].token_ids for r in llm.generate(batch, params)]

    first = fresh(0)
    assert fresh(0) == first
    assert fresh(1) != first


def test_the_engine_leaves_sampling_params_untouched(llama_case: tuple) -> None:
    model_dir, prompts, _ = llama_case
    llm = LLM(str(model_dir), dtype="float32", max_model_len=24)
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    short, long = llm.generate([{"prompt_token_ids": prompts[1]},
                                {"prompt_token_ids": prompts[2]}], params)
    assert params == SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    # Each prompt got its own default: what the context leaves after it.
    assert len(short.outputs[0].token_ids) == 24 - len(prompts[1])
    assert len(long.outputs[0].token_ids) == 24 - len(prompts[2])
