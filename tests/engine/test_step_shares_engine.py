"""The engine's tokens do not depend on how a step's prefill is split between tenants: the
same greedy, parallel-sample and beam-search requests (with prefix caching, and preemption by
recomputation and swapping from a small device pool) give the same outputs under one tenant
(first come, first served) and under three (steps shared by recent service, a bound on
shared steps, tenants lingering or not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.llm_engine import LLMEngine
from tests.checkpoints import make_checkpoint

MAX_MODEL_LEN = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("shares-llama"), "llama", vocab_size=128,
                           hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                           num_hidden_layers=1, max_position_embeddings=MAX_MODEL_LEN)


REQUESTS = [  # request id, tenant when split, prompt, params
    ("h0", "huge", [(7 * i) % 120 + 1 for i in range(60)], SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True)),
    ("h1", "huge", [(7 * i) % 120 + 1 for i in range(50)], SamplingParams(
        n=2, best_of=3, temperature=0.0, max_tokens=5, ignore_eos=True)),
    ("s0", "small", [3, 4, 5, 6, 7, 8], SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True)),
    ("b0", "beams", [(5 * i) % 120 + 2 for i in range(20)], SamplingParams(
        n=2, use_beam_search=True, temperature=0.0, max_tokens=5, ignore_eos=True)),
    ("s1", "small", [3, 4, 5, 6, 7, 8, 9, 10, 11], SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True)),
]


def run(model_dir: Path, split: bool, mode: str, bound: int | None = None,
        linger: float = 5.0) -> tuple[dict[str, list[list[int]]], int]:
    engine = LLMEngine(EngineArgs(
        model=str(model_dir), dtype="float32", kernel_backend="torch", skip_tokenizer_init=True,
        num_kv_blocks=24, block_size=4, max_num_batched_tokens=24, max_num_seqs=6,
        enable_prefix_caching=True, preemption_mode=mode, swap_space=0.01,
        max_shared_prefill_tokens=bound, tenant_linger_seconds=linger))
    outputs: dict[str, list[list[int]]] = {}
    for index, (request_id, tenant, prompt, params) in enumerate(REQUESTS):
        engine.add_request(request_id, prompt, params, tenant=tenant if split else None)
        if index < 2:
            engine.step()  # the huge tenant's prompts are running when the others arrive
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = [list(o.token_ids) for o in output.outputs]
    return outputs, engine.scheduler.stats(with_occupancy=False).num_preemptions


@pytest.mark.parametrize(("mode", "bound", "linger"), [
    ("recompute", 12, 5.0), ("swap", 12, 5.0),
    ("recompute", None, 0.0),  # the default bound: a token a tenant (24 // 16)
])
def test_tenant_shares_change_no_tokens(model_dir: Path, mode: str, bound: int | None,
                                        linger: float) -> None:
    fcfs, _ = run(model_dir, split=False, mode=mode)
    shared, num_preemptions = run(model_dir, split=True, mode=mode, bound=bound, linger=linger)
    assert shared == fcfs
    assert sorted(shared) == ["b0", "h0", "h1", "s0", "s1"]
    assert num_preemptions > 0
