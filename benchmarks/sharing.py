"""KV memory saved by sharing blocks between the samples or beams of a request.

The PagedAttention paper's measurement for parallel sampling (n = 2, 4, 6) and beam search
(width 2, 4, 6) on Alpaca-like (mean input 19 / output 58 tokens) and ShareGPT-like (161 / 338)
lengths, lognormal and seeded. The engine's Scheduler and BlockManager run each workload under
one fixed KV budget, driven by a fake runner that appends one token per step (see
``kv_sim.py``); all requests arrive at once, so the budget bounds the batch.

Parallel sampling forks the n - 1 other samples when the prompt's first token is sampled, as
the engine's output processor does; every sample then appends its own token, so the prompt's
full blocks stay shared and its partially filled last block is copied on write. Beam search
re-derives each request's ``width`` beams every step: ``width`` parents are drawn, with
replacement, from Dirichlet-weighted current beams (``--beam-concentration``: lower favours
fewer parents, as a beam search ranking does), a parent drawn k times is forked k - 1 times
with ``Scheduler.fork_seq`` and a beam not drawn is dropped with ``Scheduler.free_seq``. Beams
therefore share every block up to where their histories diverge. Every sample or beam runs to
its request's drawn output length.

How the two sides are counted, at every step where requests wait or are swapped out (the
budget, not demand, bounds the batch; ``max_num_seqs`` may too): *with sharing* is the device
blocks the block manager has in use (each physical block once, however many block tables hold
it); *without sharing* is the sum of the running sequences' block-table lengths, i.e. the
blocks the same sequences would hold if each sample or beam kept its own copy of every block it
references. The saving of a step is ``1 - with / without``; a case's saving is its mean over
those steps. Both sides come from the same run, so the schedule is the same.

Prints a table, then as the last line one JSON object: the saving (a fraction) per case, keyed
``parallel_n{n}_{trace}`` and ``beam_w{width}_{trace}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from dataclasses import dataclass

from benchmarks.kv_sim import (
    ALPACA,
    PROMPT_VOCAB,
    SHAREGPT,
    LengthProfile,
    lognormal_lengths,
    make_scheduler,
    running_seqs,
    synthetic_prompt,
)
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

WIDTHS = (2, 4, 6)
# The paper's savings (percent) over widths 2-6, for the table only.
PAPER_RANGES = {
    ("parallel", "alpaca"): "6.1-9.8", ("beam", "alpaca"): "37.6-55.2",
    ("parallel", "sharegpt"): "16.2-30.5", ("beam", "sharegpt"): "44.3-66.3",
}
FULL_DEFAULTS = {"num_requests_alpaca": 1000, "num_requests_sharegpt": 200, "num_kv_blocks": 1024}
QUICK_DEFAULTS = {"num_requests_alpaca": 200, "num_requests_sharegpt": 40, "num_kv_blocks": 512}
MIN_CONCENTRATION = 0.1  # below this the Dirichlet weights can all underflow to zero


@dataclass(frozen=True, slots=True)
class Case:
    mode: str  # "parallel" or "beam"
    width: int  # n samples, or beam width
    profile: LengthProfile

    @property
    def name(self) -> str:
        letter = "n" if self.mode == "parallel" else "w"
        return f"{self.mode}_{letter}{self.width}_{self.profile.name}"

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        if self.mode == "beam":
            return SamplingParams(n=self.width, use_beam_search=True, temperature=0.0,
                                  max_tokens=max_tokens, ignore_eos=True)
        return SamplingParams(n=self.width, max_tokens=max_tokens, ignore_eos=True)


@dataclass(slots=True)
class SharingResult:
    case: Case
    saturated_steps: int = 0
    saving_sum: float = 0.0
    shared_blocks_sum: int = 0
    unshared_blocks_sum: int = 0
    # Tokens of the sequences resident at saturated steps: what the saving depends on.
    resident_seqs_sum: int = 0
    resident_prompt_tokens_sum: int = 0
    resident_output_tokens_sum: int = 0
    output_tokens: int = 0
    preemptions: int = 0

    @property
    def saving(self) -> float:
        return self.saving_sum / self.saturated_steps if self.saturated_steps else 0.0

    @property
    def mean_shared_blocks(self) -> float:
        return self.shared_blocks_sum / self.saturated_steps if self.saturated_steps else 0.0

    @property
    def mean_unshared_blocks(self) -> float:
        return self.unshared_blocks_sum / self.saturated_steps if self.saturated_steps else 0.0

    @property
    def mean_resident_tokens(self) -> tuple[float, float]:
        """Mean (prompt, output so far) tokens of a sequence resident at a saturated step."""
        num = self.resident_seqs_sum
        if not num:
            return 0.0, 0.0
        return self.resident_prompt_tokens_sum / num, self.resident_output_tokens_sum / num


class SharingSimulation:
    """One case's workload run to completion, block counts sampled at every step."""

    def __init__(self, case: Case, work: list[tuple[int, int]], args: argparse.Namespace
                 ) -> None:
        self.case = case
        # Swap space as large as the device pool: a preempted request keeps its sharing.
        self.scheduler = make_scheduler(
            "paged", block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
            num_cpu_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len)
        self.rng = random.Random(args.seed)
        self.concentration = args.beam_concentration
        self.output_lens: dict[str, int] = {}
        self.result = SharingResult(case)
        for index, (num_input, num_output) in enumerate(work):
            request_id = f"req-{index}"
            self.output_lens[request_id] = num_output
            seq = Sequence(self.scheduler.new_seq_id(), synthetic_prompt(index, num_input),
                           args.block_size)
            self.scheduler.add_seq_group(SequenceGroup(
                request_id, [seq], case.sampling_params(num_output), arrival_time=0.0))

    def run(self) -> SharingResult:
        scheduler = self.scheduler
        while scheduler.has_unfinished_requests():
            self._step()
        if self.result.saturated_steps == 0:
            raise ValueError(
                f"case {self.case.name}: no request ever waited for the "
                f"{scheduler.block_manager.device_pool.num_blocks} KV blocks, so nothing was "
                "measured at saturation; add requests or lower --num-kv-blocks")
        self.result.preemptions = scheduler.preemption_stats.total
        return self.result

    def _step(self) -> None:
        out = self.scheduler.schedule()
        self._measure()
        self.scheduler.update_after_step(out)
        for group, seqs in _sampled_by_group(out).items():
            if self.case.mode == "beam":
                self._beam_step(group, seqs)
            else:
                self._parallel_step(group, seqs)

    def _measure(self) -> None:
        result = self.result
        scheduler = self.scheduler
        if not (scheduler.num_waiting or scheduler.num_swapped):
            return  # demand, not the KV budget, bounds the batch
        seqs = running_seqs(scheduler)
        unshared = sum(len(seq.block_table) for seq in seqs)
        if unshared == 0:
            return
        shared = scheduler.block_manager.device_pool.num_used_blocks
        distinct = len({block_id for seq in seqs for block_id in seq.block_table})
        if shared != distinct:
            raise RuntimeError(f"{shared} device blocks in use but the running block tables "
                               f"reference {distinct}")
        result.saturated_steps += 1
        result.saving_sum += 1.0 - shared / unshared
        result.shared_blocks_sum += shared
        result.unshared_blocks_sum += unshared
        result.resident_seqs_sum += len(seqs)
        result.resident_prompt_tokens_sum += sum(seq.num_prompt_tokens for seq in seqs)
        result.resident_output_tokens_sum += sum(seq.num_output_tokens for seq in seqs)

    def _parallel_step(self, group: SequenceGroup, seqs: list[Sequence]) -> None:
        if len(group.seqs) == 1 and not seqs[0].output_token_ids:
            # The prompt's first sample: the other samples fork before any appends.
            parent = seqs[0]
            seqs = [parent] + [self.scheduler.fork_seq(parent, group)
                               for _ in range(self.case.width - 1)]
        for seq in seqs:
            self._append(seq, group)

    def _beam_step(self, group: SequenceGroup, beams: list[Sequence]) -> None:
        live = group.get_seqs(SequenceStatus.RUNNING)
        if len(beams) != len(live):
            raise RuntimeError(f"request {group.request_id!r} sampled {len(beams)} of its "
                               f"{len(live)} beams in one step")
        counts = self._draw_parents(len(beams))
        for beam, count in zip(beams, counts):
            if count == 0:
                self.scheduler.free_seq(beam)  # first, so its blocks are free for the forks
        kept = []
        for beam, count in zip(beams, counts):
            if count:
                kept.append(beam)
                kept.extend(self.scheduler.fork_seq(beam, group) for _ in range(count - 1))
        for beam in kept:
            self._append(beam, group)

    def _draw_parents(self, num_beams: int) -> list[int]:
        """How many of the next beams continue each current beam (they sum to the width)."""
        weights = [self.rng.gammavariate(self.concentration, 1.0) for _ in range(num_beams)]
        counts = [0] * num_beams
        for parent in self.rng.choices(range(num_beams), weights, k=self.case.width):
            counts[parent] += 1
        return counts

    def _append(self, seq: Sequence, group: SequenceGroup) -> None:
        seq.append_token(seq.seq_id % PROMPT_VOCAB, 0.0)
        self.result.output_tokens += 1
        if seq.num_output_tokens >= self.output_lens[group.request_id]:
            self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_LENGTH)


def _sampled_by_group(out: SchedulerOutput) -> dict[SequenceGroup, list[Sequence]]:
    """The sequences that sampled a token this step, by request, in batch order."""
    groups: dict[SequenceGroup, list[Sequence]] = defaultdict(list)
    for item in out.scheduled:
        if item.samples:
            groups[item.seq_group].append(item.seq)
    return groups


def cases() -> list[Case]:
    return [Case(mode, width, profile) for profile in (ALPACA, SHAREGPT)
            for mode in ("parallel", "beam") for width in WIDTHS]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests-alpaca", type=int, default=None,
                        help="default 1000 (--quick: 200)")
    parser.add_argument("--num-requests-sharegpt", type=int, default=None,
                        help="default 200 (--quick: 40)")
    parser.add_argument("--block-size", type=int, default=16)
    # 1024 blocks of 16 tokens is about the KV room of OPT-13B on a 40 GB A100, the paper's
    # setup for this measurement.
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="the fixed KV budget in blocks, the same for every case "
                             "(default 1024; --quick: 512)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--beam-concentration", type=float, default=1.0,
                        help="Dirichlet concentration of the beam parents' weights")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="fewer requests under a smaller budget (under 30 s)")
    args = parser.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("num_requests_alpaca", "num_requests_sharegpt", "num_kv_blocks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                         f"got {getattr(args, name)}")
    if args.beam_concentration < MIN_CONCENTRATION:
        parser.error(f"--beam-concentration must be at least {MIN_CONCENTRATION}, "
                     f"got {args.beam_concentration}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    num_requests = {ALPACA.name: args.num_requests_alpaca,
                    SHAREGPT.name: args.num_requests_sharegpt}
    workloads = {profile.name: lognormal_lengths(profile, num_requests[profile.name],
                                                 args.max_model_len, args.seed)
                 for profile in (ALPACA, SHAREGPT)}
    print(f"KV budget {args.num_kv_blocks} blocks of {args.block_size} tokens; "
          + "; ".join(f"{name}: {len(work)} requests, mean input "
                      f"{sum(i for i, _ in work) / len(work):.0f}, mean output "
                      f"{sum(o for _, o in work) / len(work):.0f}"
                      for name, work in workloads.items()))
    print("saving: mean over saturated steps of 1 - blocks / unshared; prompt, output: mean "
          "tokens of a resident sequence")
    print(f"{'case':<22}{'saving %':>9}{'paper %':>11}{'blocks':>8}{'unshared':>10}"
          f"{'prompt':>8}{'output':>8}{'sat steps':>11}{'preempt':>9}")
    savings = {}
    for case in cases():
        try:
            result = SharingSimulation(case, workloads[case.profile.name], args).run()
        except ValueError as exc:
            print(f"sharing.py: error: {exc}", file=sys.stderr)
            return 2
        savings[case.name] = round(result.saving, 4)
        paper = PAPER_RANGES[case.mode, case.profile.name]
        prompt, output = result.mean_resident_tokens
        print(f"{case.name:<22}{100 * result.saving:>9.1f}{paper:>11}"
              f"{result.mean_shared_blocks:>8.0f}{result.mean_unshared_blocks:>10.0f}"
              f"{prompt:>8.0f}{output:>8.0f}{result.saturated_steps:>11}"
              f"{result.preemptions:>9}")
        sys.stdout.flush()
    print(json.dumps(savings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
