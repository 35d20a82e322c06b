"""KV cache memory: the paged policy against contiguous reservation, same run, same budget.

The scheduler and block manager are driven by a fake model runner that appends one token per
step to each sequence that samples, on a ShareGPT-like workload (lognormal input and output
lengths with the paper's means, 161 and 338 tokens, seeded). All requests arrive at once, so
the KV budget decides how many run together. The budget is sized so that the ``contiguous``
policy, which reserves ``max_model_len`` tokens per request at admission, fits only a handful.

Measured per policy: KV utilization (token slots holding real tokens over slots allocated,
averaged over the steps where requests wait for memory), the most and the mean running
requests at those steps, and steps to drain the workload. ``concurrency_ratio`` compares the
means: the paged maximum is inflated by an admission burst of short prompts that preemption
later undoes. No model runs, so no time is measured. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

from benchmarks.kv_sim import (
    SHAREGPT,
    lognormal_lengths,
    make_scheduler,
    running_seqs,
    synthetic_prompt,
)
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.kv_allocation import cdiv
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_stats import TokenOccupancy
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


@dataclass(slots=True)
class PolicyResult:
    policy: str
    steps: int = 0
    output_tokens: int = 0
    max_running: int = 0
    saturated_steps: int = 0
    utilization_sum: float = 0.0
    running_sum: int = 0
    preemptions: int = 0

    @property
    def kv_utilization(self) -> float:
        return self.utilization_sum / self.saturated_steps if self.saturated_steps else 0.0

    @property
    def mean_running(self) -> float:
        return self.running_sum / self.saturated_steps if self.saturated_steps else 0.0


def simulate(policy: str, work: list[tuple[int, int]], args: argparse.Namespace
             ) -> PolicyResult:
    scheduler = make_scheduler(
        policy, block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, num_cpu_blocks=0,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len)
    output_lens = {}
    for index, (num_input, num_output) in enumerate(work):
        prompt = synthetic_prompt(index, num_input)
        request_id = f"req-{index}"
        output_lens[request_id] = num_output
        scheduler.add_seq_group(SequenceGroup(
            request_id, [Sequence(index, prompt, args.block_size)],
            SamplingParams(max_tokens=num_output), arrival_time=0.0))
    result = PolicyResult(policy)
    while scheduler.has_unfinished_requests():
        _step(scheduler, output_lens, result)
    result.preemptions = scheduler.preemption_stats.total
    return result


def _step(scheduler: Scheduler, output_lens: dict[str, int], result: PolicyResult) -> None:
    out = scheduler.schedule()
    running = running_seqs(scheduler)
    result.steps += 1
    result.max_running = max(result.max_running, len(running))
    if scheduler.num_waiting > 0:  # memory, not demand, bounds the batch
        occupancy = TokenOccupancy.of(running, scheduler.block_manager.block_size)
        result.saturated_steps += 1
        result.utilization_sum += occupancy.utilization
        result.running_sum += len(running)
    scheduler.update_after_step(out)
    for item in out.scheduled:
        if not item.samples:
            continue
        seq = item.seq
        seq.append_token(7, 0.0)
        result.output_tokens += 1
        if seq.num_output_tokens >= output_lens[item.seq_group.request_id]:
            scheduler.finish_seq(seq, SequenceStatus.FINISHED_LENGTH)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--contiguous-fit", type=int, default=8,
                        help="requests the contiguous policy can hold at once; sets the budget")
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="KV budget in blocks (default: from --contiguous-fit)")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 requests (under 30 s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_requests = 200
    if args.num_kv_blocks is None:
        # Room for the reservations plus the default 1% watermark the scheduler keeps free.
        reserved = args.contiguous_fit * cdiv(args.max_model_len, args.block_size)
        args.num_kv_blocks = math.ceil(reserved / 0.99) + 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = lognormal_lengths(SHAREGPT, args.num_requests, args.max_model_len, args.seed)
    mean_in = sum(i for i, _ in work) / len(work)
    mean_out = sum(o for _, o in work) / len(work)
    print(f"{len(work)} requests, mean input {mean_in:.0f}, mean output {mean_out:.0f} tokens; "
          f"{args.num_kv_blocks} blocks of {args.block_size} tokens "
          f"({args.num_kv_blocks * args.block_size} token slots), max_model_len "
          f"{args.max_model_len}")
    paged, contiguous = (simulate(policy, work, args) for policy in ("paged", "contiguous"))
    print(f"{'policy':<12}{'kv util':>9}{'max run':>9}{'mean run':>10}{'steps':>9}"
          f"{'preempt':>9}")
    for result in (paged, contiguous):
        print(f"{result.policy:<12}{result.kv_utilization:>9.3f}{result.max_running:>9}"
              f"{result.mean_running:>10.1f}{result.steps:>9}{result.preemptions:>9}")
    assert paged.output_tokens == contiguous.output_tokens == sum(o for _, o in work)
    print(json.dumps({
        "num_requests": len(work),
        "num_kv_blocks": args.num_kv_blocks,
        "block_size": args.block_size,
        "paged_kv_utilization": round(paged.kv_utilization, 4),
        "contiguous_kv_utilization": round(contiguous.kv_utilization, 4),
        "paged_max_running": paged.max_running,
        "contiguous_max_running": contiguous.max_running,
        "paged_mean_running": round(paged.mean_running, 1),
        "contiguous_mean_running": round(contiguous.mean_running, 1),
        "concurrency_ratio": round(paged.mean_running / contiguous.mean_running, 2),
        "max_running_ratio": round(paged.max_running / contiguous.max_running, 2),
        "steps_ratio": round(contiguous.steps / paged.steps, 2),
        "paged_preemptions": paged.preemptions,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
