"""The most KV cache the work a scheduler holds can come to need, if nothing stops early.

Every running sequence grows a token per step until its ``max_tokens`` (or the model's
length); when it finishes, the blocks it alone references go back to the pool. Waiting and
swapped requests are counted as if they started now, every token in blocks of their own.
The peak of that projection, over the steps to come, is what the cache must hold for the
work already accepted to finish without a preemption. It is an upper bound: prefix-cache
hits and answers that stop early only lower it.

Clients read it (``kv_projected_usage`` in the load hints) to size their in-flight tokens
by what the server will need rather than by the sum of their reservations, which counts a
shared prefix once per request and every answer at its full length at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pagedserve.server.engine.core.sequence import SequenceStatus

if TYPE_CHECKING:
    from pagedserve.server.engine.core.block_pool import BlockPool
    from pagedserve.server.engine.core.scheduler import Scheduler
    from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup

# The projection is computed again at least this often while the requests held stay the
# same in number (the load hints carry it).
PROJECTION_EVERY_S = 0.05


@dataclass(slots=True)
class Demands:
    """The sequences' parts in the projection, one list per field. A sequence's next step
    writes the KV of its token ``num_tokens - 1`` (the newest is sampled, not yet cached),
    so ``t`` steps from now it needs ``num_tokens - 1 + t`` slots, up to ``t = remaining``;
    then it ends and gives back its ``private`` blocks and whatever it grew. ``held`` is the
    blocks of its table it can write into (0 while it waits)."""

    num_tokens: list[int] = field(default_factory=list)
    remaining: list[int] = field(default_factory=list)  # tokens it may still generate
    held: list[int] = field(default_factory=list)
    private: list[int] = field(default_factory=list)  # held blocks no other table references

    def add(self, num_tokens: int, remaining: int, held: int, private: int) -> None:
        self.num_tokens.append(num_tokens)
        self.remaining.append(remaining)
        self.held.append(held)
        self.private.append(private)


def remaining_tokens(seq: Sequence, group: SequenceGroup, max_model_len: int) -> int:
    """Tokens ``seq`` may still generate: to its ``max_tokens`` and the model's length."""
    room = max_model_len - seq.num_tokens
    max_tokens = group.sampling_params.max_tokens
    if max_tokens is not None:
        room = min(room, max_tokens - seq.num_output_tokens)
    return max(0, room)


def add_running(demands: Demands, groups: Iterable[SequenceGroup], pool: BlockPool,
                max_model_len: int) -> None:
    """Running sequences. Sharing is always a prefix of a table (a cached prompt prefix, a
    fork's or a beam's history up to where it diverged), so the shared blocks are counted
    up to the first private one: one look per sequence that shares nothing. A shared block
    the next token lands in counts as not held (the write copies it first)."""
    blocks = pool.blocks  # read-only here: a hot path, one step in every few
    for group in groups:
        for seq in group.seqs:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            table = seq.block_table
            shared = 0
            for block in table:
                if blocks[block].ref_cnt == 1:
                    break
                shared += 1
            held = len(table)
            next_block = (len(seq.token_ids) - 1) // seq.block_size
            writable = next_block if next_block < shared else held
            demands.add(len(seq.token_ids), remaining_tokens(seq, group, max_model_len),
                        writable, held - shared)


def add_queued(demands: Demands, groups: Iterable[SequenceGroup], max_model_len: int) -> None:
    """Waiting or swapped requests as if they started now, holding no device block: each
    sequence, forks to come included, in blocks of its own."""
    for group in groups:
        seqs = group.get_unfinished_seqs()
        if not seqs:
            continue
        forks = max(0, group.max_num_running_seqs() - len(seqs))
        for seq in seqs + [seqs[0]] * forks:
            demands.add(seq.num_tokens, remaining_tokens(seq, group, max_model_len), 0, 0)


def peak_growth_blocks(demands: Demands, block_size: int) -> int:
    """The most blocks the demands will hold beyond what they hold now, at any step ahead.

    The growth only rises while no sequence ends, so the peak falls on a step where one
    does: only those steps are evaluated (vectorised, n sequences by at most n steps)."""
    steps = sorted({r for r in demands.remaining if r > 0})
    if not steps:
        return 0
    base = torch.tensor(demands.num_tokens, dtype=torch.int64) - 1
    remaining = torch.tensor(demands.remaining, dtype=torch.int64)
    held = torch.tensor(demands.held, dtype=torch.int64)
    private = torch.tensor(demands.private, dtype=torch.int64)
    t = torch.tensor(steps, dtype=torch.int64)
    needed = (base[:, None] + t[None, :] + block_size - 1) // block_size
    grown = (needed - held[:, None]).clamp_(min=0)
    live = remaining[:, None] >= t[None, :]
    growth = torch.where(live, grown, -private[:, None]).sum(0)
    return max(0, int(growth.max()))


def projected_blocks(scheduler: Scheduler) -> int:
    """Device blocks the scheduler's work will need at its peak (see the module)."""
    manager = scheduler.block_manager
    pool, block_size = manager.device_pool, manager.block_size
    max_model_len = scheduler.config.max_model_len
    demands = Demands()
    add_running(demands, scheduler.running, pool, max_model_len)
    add_queued(demands, [*scheduler.waiting, *scheduler.swapped], max_model_len)
    return pool.num_used_blocks + peak_growth_blocks(demands, block_size)


def projected_usage(scheduler: Scheduler) -> float:
    """``projected_blocks`` as a share of the device cache (can exceed 1)."""
    num_blocks = scheduler.block_manager.device_pool.num_blocks
    return projected_blocks(scheduler) / num_blocks if num_blocks else 0.0


class CachedProjection:
    """``projected_usage`` of one scheduler, computed again when the requests it holds
    changed in number (an admission or an end moves the projection most) or ``every_s``
    passed, else the last value: a pass over the running sequences costs about 0.7 ms at
    256 of them on a CPU, and the server reads it after every step."""

    def __init__(self, scheduler: Scheduler, every_s: float = PROJECTION_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._scheduler = scheduler
        self._every_s = every_s
        self._clock = clock
        # (when, the requests held then, the projected usage)
        self._last: tuple[float, tuple[int, int, int], float] | None = None

    def usage(self) -> float:
        scheduler, now = self._scheduler, self._clock()
        held = (scheduler.num_running, scheduler.num_waiting, scheduler.num_swapped)
        last = self._last
        if last is None or held != last[1] or now - last[0] >= self._every_s:
            self._last = last = (now, held, projected_usage(scheduler))
        return last[2]
