"""What the web page's engine snapshot costs the step loop, at 64 running sequences.

The default model (SmolLM2-135M-Instruct, as ``make run`` serves it) decodes 64 sequences at
once (128-token prompts, ``--max-tokens`` out, all running from the first step). After every
decode step the loop builds a snapshot, as it would if someone read ``/engine/state`` between
every two steps (the page reads four times a second, so at most this often), and each build
is timed beside the step before it: the ratio is the snapshot's cost per step in the worst
case. The flag test a loop pays when nobody reads is timed too, and so is the JSON body the
handler makes from a snapshot (on the event loop, not in the step loop). All in one process,
interleaved step by step, so that the machine's load falls on both alike.

A build visits every block handed out so far, so on a GPU with a large cache it costs more:
``--large-pool N`` also times the block pass over a model-free pool of N blocks, all in use.

    python -m benchmarks.engine_snapshot [--num-seqs 64] [--max-tokens 24] [--threads 2]
                                         [--large-pool 100000]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def median_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def large_pool_ms(num_blocks: int, repeats: int = 20) -> float:
    from pagedserve.server.engine.core.block_pool import BlockPool
    from pagedserve.server.engine.engine_snapshot import block_states

    pool = BlockPool(num_blocks)
    for _ in range(num_blocks):
        pool.allocate()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        block_states(pool)
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def run(args: argparse.Namespace) -> dict[str, float | int]:
    from pagedserve.common.sampling_params import SamplingParams
    from pagedserve.server.api.web.engine_state import state_body
    from pagedserve.server.engine.config.engine_args import EngineArgs
    from pagedserve.server.engine.engine_snapshot import BlockState, SnapshotPublisher
    from pagedserve.server.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineArgs(model=args.model, max_num_seqs=args.num_seqs,
                                  max_num_batched_tokens=max(2048, 128 * args.num_seqs),
                                  cpu_threads=args.threads))
    publisher = SnapshotPublisher(engine.scheduler)
    engine.add_step_observer(publisher)
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for i in range(args.num_seqs):
        prompt = torch.randint(0, vocab, (128,), generator=gen).tolist()
        engine.add_request(f"r{i}", prompt, params)

    steps, builds, idle_checks, bodies = [], [], [], []
    running = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        step_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(1000):
            publisher.publish()  # nobody asked: the flag test alone
        idle_checks.append((time.perf_counter() - start) / 1000)
        publisher.latest()
        start = time.perf_counter()
        publisher.publish()  # someone asked: a build
        build_s = time.perf_counter() - start
        snapshot = publisher.current  # read without asking for the next
        start = time.perf_counter()
        state_body(snapshot, "smollm2")
        bodies.append(time.perf_counter() - start)
        if snapshot.num_running == args.num_seqs and snapshot.num_waiting == 0:
            steps.append(step_s)
            builds.append(build_s)
            running.append(snapshot.count(BlockState.USED) + snapshot.count(BlockState.SHARED))
    step_ms, build_ms = median_ms(steps), median_ms(builds)
    return {
        "model": args.model,
        "num_seqs": args.num_seqs,
        "threads": torch.get_num_threads(),
        "num_blocks": engine.scheduler.block_manager.device_pool.num_blocks,
        "blocks_in_use": max(running),
        "steps_measured": len(steps),
        "step_ms": round(step_ms, 3),
        "snapshot_ms": round(build_ms, 4),
        "snapshot_share_of_step": round(build_ms / step_ms, 5),
        "unread_check_us": round(1e6 * statistics.median(idle_checks), 3),
        "state_body_ms": round(median_ms(bodies), 4),
        "large_pool_blocks": args.large_pool,
        "large_pool_snapshot_ms": round(large_pool_ms(args.large_pool), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--large-pool", type=int, default=100_000)
    args = parser.parse_args()
    result = run(args)
    for key, value in result.items():
        print(f"{key:>24}: {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
