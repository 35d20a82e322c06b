"""Model-free KV simulation: seeded request lengths and the real scheduler over a block budget.

The memory benchmarks drive the engine's ``Scheduler`` and ``BlockManager`` with a fake model
runner that appends one token per step to each sequence that samples, so what they measure is
the block accounting itself. No model runs, so no time is measured. The memory benchmarks
import it as ``benchmarks.kv_sim``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.sequence import Sequence, SequenceStatus

# Spread of the lognormal length draws (of the underlying normal); the means are the traces'.
SIGMA = 0.9
# Synthetic prompt token ids stay below this, inside any real vocabulary.
PROMPT_VOCAB = 50_000


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """Mean input and output lengths of a trace, as the PagedAttention paper reports them."""

    name: str
    mean_input: int
    mean_output: int


SHAREGPT = LengthProfile("sharegpt", 161, 338)
ALPACA = LengthProfile("alpaca", 19, 58)
PROFILES = {profile.name: profile for profile in (SHAREGPT, ALPACA)}


def lognormal_lengths(profile: LengthProfile, num_requests: int, max_model_len: int,
                      seed: int) -> list[tuple[int, int]]:
    """(input, output) lengths, lognormal around the profile's means, fitted to max_model_len.

    Each request draws its input length, then its output length, from one seeded stream, so a
    workload is reproducible and a longer one extends a shorter one.
    """
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be at least 2, got {max_model_len}")
    rng = random.Random(seed)
    work = []
    for _ in range(num_requests):
        num_input = _lognormal(rng, profile.mean_input, max_model_len - 1)
        work.append((num_input, _lognormal(rng, profile.mean_output, max_model_len - num_input)))
    return work


def _lognormal(rng: random.Random, mean: float, upper: int) -> int:
    # mu is set so that the distribution's mean (not its median) is ``mean``.
    value = rng.lognormvariate(math.log(mean) - SIGMA**2 / 2, SIGMA)
    return min(max(round(value), 1), upper)


def synthetic_prompt(index: int, num_tokens: int) -> list[int]:
    """Token ids for request ``index``; prompts of different requests differ."""
    return [(index * 31 + i) % PROMPT_VOCAB for i in range(num_tokens)]


def make_scheduler(policy: str, *, block_size: int, num_kv_blocks: int, num_cpu_blocks: int,
                   max_num_seqs: int, max_num_batched_tokens: int,
                   max_model_len: int) -> Scheduler:
    """The engine's scheduler with its block manager over ``num_kv_blocks`` device blocks."""
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len),
        CacheConfig(block_size=block_size, kv_allocation=policy),
        num_device_blocks=num_kv_blocks, num_cpu_blocks=num_cpu_blocks)


def running_seqs(scheduler: Scheduler) -> list[Sequence]:
    """The sequences whose blocks are on the device now."""
    return [seq for group in scheduler.running
            for seq in group.get_seqs(SequenceStatus.RUNNING)]
