"""Iteration-level scheduler with chunked prefill and preemption: FCFS, fair between
tenants at admission."""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagedserve.common.engine_errors import (
    BlockAllocationError,
    InvalidRequestError,
    QueueFullError,
)
from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.admissibility import check_admissible
from pagedserve.server.engine.core.block_manager import AllocStatus, BlockManager
from pagedserve.server.engine.core.fair_share import TenantShares
from pagedserve.server.engine.core.integrity import check_scheduler_integrity
from pagedserve.server.engine.core.scheduler_output import ScheduledSequence, SchedulerOutput
from pagedserve.server.engine.core.scheduler_stats import PreemptionStats, SchedulerStats
from pagedserve.server.engine.core.scheduler_updates import StepUpdater
from pagedserve.server.engine.core.scheduling_budget import SchedulingBudget
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.engine.core.step_shares import StepShares
from pagedserve.server.engine.core.tenant_activity import TenantActivity

if TYPE_CHECKING:
    from pagedserve.server.engine.core.scheduler_output import SampledBatch, StepUpdate

RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED
WAITING = SequenceStatus.WAITING


class Scheduler:
    """Decides, step by step, which sequences compute how many tokens.

    Each step serves the running requests first (oldest first; when blocks run out the
    latest arrival is preempted), then swaps preempted requests back in, then admits waiting
    ones, all within ``max_num_batched_tokens`` tokens (prompts are prefilled in chunks) and
    ``max_num_seqs`` sequences. A step that preempts admits nothing new. The queues are kept
    in arrival order, so a request preempted by recomputation goes back ahead of newer ones.
    Waiting requests are admitted fairly between tenants (``fair_share.py``), in arrival
    order within one; while several tenants are live, the step's prefill tokens are bounded
    and go to the tenant served least lately first (``step_shares.py``,
    ``tenant_activity.py``).

    Sequence ids must be unique among live sequences; :meth:`new_seq_id` hands out ids that
    are, and :meth:`fork_seq` uses it. Applying a step's results (appending tokens, forks,
    finishing) is delegated to a ``StepUpdater`` (``scheduler_updates.py``) that works
    through this class's single operations.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_device_blocks: int,
        num_cpu_blocks: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockManager.from_config(
            cache_config, scheduler_config.max_model_len, num_device_blocks, num_cpu_blocks)
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.preemption_stats = PreemptionStats()
        self.tenant_shares = TenantShares()
        self._groups: dict[str, SequenceGroup] = {}
        self._seq_groups: dict[int, SequenceGroup] = {}
        self._arrival_order: dict[str, int] = {}
        self._arrivals = itertools.count()
        self._next_seq_id = 0
        self._clock = clock
        # Work done between steps (forks, aborts) that the next SchedulerOutput reports.
        self._pending = SchedulerOutput()
        self._updater = StepUpdater(self, clock)
        self.tenant_activity = TenantActivity(scheduler_config.tenant_linger_seconds, clock)

    # ------------------------------------------------------------------ requests

    def new_seq_id(self) -> int:
        """An id no sequence this scheduler has seen uses."""
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        return seq_id

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue a request, or raise if it can never run or the queue is full."""
        self._validate(seq_group)
        self.check_queue_room()
        request_id = seq_group.request_id
        self._groups[request_id] = seq_group
        self._arrival_order[request_id] = next(self._arrivals)
        for seq in seq_group.seqs:
            self._seq_groups[seq.seq_id] = seq_group
            self._next_seq_id = max(self._next_seq_id, seq.seq_id + 1)
        self.waiting.append(seq_group)

    def check_queue_room(self, num_arriving: int = 0) -> None:
        """Raise QueueFullError unless one more request fits the waiting queue, counting
        ``num_arriving`` requests on their way in (accepted but not yet added)."""
        limit = self.config.max_waiting_requests
        num_waiting = len(self.waiting) + num_arriving
        if limit is not None and num_waiting >= limit:
            raise QueueFullError(
                f"the waiting queue is full ({num_waiting} requests, "
                f"max_waiting_requests={limit}); retry later")

    def _validate(self, seq_group: SequenceGroup) -> None:
        if seq_group.request_id in self._groups:
            raise InvalidRequestError(
                f"request id {seq_group.request_id!r} is already in use", param="request_id")
        for seq in seq_group.seqs:
            if seq.status is not WAITING or seq.block_table:
                raise ValueError(f"sequence {seq.seq_id} must be new (WAITING, no blocks)")
            if seq.seq_id in self._seq_groups:
                raise ValueError(f"sequence id {seq.seq_id} is already in use")
        check_admissible(seq_group, self.config, self.block_manager)

    def _retire(self, seq_group: SequenceGroup, report: SchedulerOutput | None = None) -> None:
        """Forget a finished request; ``report`` (default: the next step's output) lists it."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq_group in queue:
                queue.remove(seq_group)
        request_id = seq_group.request_id
        self.tenant_activity.finished(seq_group.tenant)
        del self._groups[request_id]
        del self._arrival_order[request_id]
        for seq in seq_group.seqs:
            self._seq_groups.pop(seq.seq_id, None)
        (report if report is not None else self._pending).finished_request_ids.append(request_id)

    # ------------------------------------------------------------------ the step

    def schedule(self) -> SchedulerOutput:
        """The next step: which sequences compute how many tokens, and the block operations
        to do first. The caller runs it, then calls :meth:`update_from_output`."""
        output, self._pending = self._pending, SchedulerOutput()
        budget = SchedulingBudget(self.config.max_num_batched_tokens, self._step_shares())
        self._schedule_running(output, budget)
        if not output.preempted:
            self._schedule_swapped(output, budget)
        if not output.preempted and not self.swapped:
            self._schedule_waiting(output, budget)
        self.tenant_activity.record(output)
        return output

    def _step_shares(self) -> StepShares | None:
        return StepShares.of(
            self.running, self.swapped, self.waiting, self.tenant_activity.lingering(),
            lambda group: self.block_manager.can_allocate(group) is AllocStatus.OK,
            self.config.max_num_batched_tokens, self.config.max_shared_prefill_tokens,
            self.tenant_activity.served, self.tenant_shares.rank)

    def _schedule_running(self, output: SchedulerOutput, budget: SchedulingBudget) -> None:
        index = 0
        while index < len(self.running):
            seq_group = self.running[index]
            plan = budget.plan(seq_group)
            if plan is None:
                return  # out of tokens: later requests wait for the next step
            if plan and not self._make_room(seq_group, output):
                return  # seq_group was the latest arrival and preempted itself
            self._schedule_group(seq_group, plan, output, budget)
            index += 1

    def _make_room(self, seq_group: SequenceGroup, output: SchedulerOutput) -> bool:
        while not self.block_manager.can_append_slots(seq_group):
            victim = self.running[-1]
            self._preempt(victim, output)
            if victim is seq_group:
                return False
        return True

    def _schedule_swapped(self, output: SchedulerOutput, budget: SchedulingBudget) -> None:
        if not self.swapped:
            return
        num_seqs = self.num_running_seqs()
        while self.swapped:
            seq_group = self.swapped[0]
            width = seq_group.max_num_running_seqs()
            if (num_seqs + width > self.config.max_num_seqs
                    or budget.tokens_left < seq_group.num_seqs(SWAPPED)):
                return
            # With nothing running no block will be freed, so the watermark cannot apply.
            if not self.block_manager.can_swap_in(seq_group, use_watermark=bool(self.running)):
                if self.running:
                    return
                self._swapped_to_waiting(seq_group)
                continue
            self.swapped.pop(0)
            output.blocks_to_swap_in.extend(self.block_manager.swap_in(seq_group))
            self._start_running(seq_group, SWAPPED)
            self._schedule_group(seq_group, budget.plan(seq_group) or [], output, budget)
            num_seqs += width

    def _schedule_waiting(self, output: SchedulerOutput, budget: SchedulingBudget) -> None:
        if not self.waiting:
            return
        num_seqs = self.num_running_seqs()
        order = self.tenant_shares.order(self.waiting, self._arrival_of)
        while order:
            seq_group = order.next()
            width = seq_group.max_num_running_seqs()
            if num_seqs + width > self.config.max_num_seqs:
                return
            status = self.block_manager.can_allocate(seq_group)
            if status is AllocStatus.NEVER:
                order.remove(seq_group)
                self._ignore(seq_group, output)
                continue
            if status is AllocStatus.LATER or budget.tokens_left < seq_group.num_seqs(WAITING):
                return
            if not budget.admits(seq_group):
                order.drop_tenant(seq_group.tenant)  # its share of the step is spent
                continue
            order.remove(seq_group)
            self.waiting.remove(seq_group)
            self.block_manager.allocate(seq_group)
            self.tenant_shares.charge(seq_group)
            self._start_running(seq_group, WAITING)
            self._schedule_group(seq_group, budget.plan(seq_group) or [], output, budget)
            num_seqs += width

    def _schedule_group(self, seq_group: SequenceGroup, plan: list[tuple[Sequence, int]],
                        output: SchedulerOutput, budget: SchedulingBudget) -> None:
        budget.spend(seq_group, sum(num_new_tokens for _, num_new_tokens in plan))
        for seq, num_new_tokens in plan:
            output.blocks_to_copy.extend(self.block_manager.append_slots(seq, num_new_tokens))
            output.scheduled.append(ScheduledSequence.of(seq, seq_group, num_new_tokens))
        if plan and seq_group.metrics.first_scheduled_time is None:
            seq_group.metrics.first_scheduled_time = self._clock()

    def _start_running(self, seq_group: SequenceGroup, from_status: SequenceStatus) -> None:
        for seq in seq_group.get_seqs(from_status):
            seq.status = RUNNING
        self._insert_by_arrival(self.running, seq_group)

    def _swapped_to_waiting(self, seq_group: SequenceGroup) -> None:
        """A swapped request that outgrew the device pool can only come back by recomputation
        (and is ignored if its tokens cannot fit either)."""
        self.swapped.remove(seq_group)
        for seq in seq_group.get_seqs(SWAPPED):
            self.block_manager.free(seq)
            seq.reset_for_recompute()
        self._insert_by_arrival(self.waiting, seq_group)

    def _ignore(self, seq_group: SequenceGroup, output: SchedulerOutput) -> None:
        for seq in seq_group.get_unfinished_seqs():
            self._finish(seq, SequenceStatus.FINISHED_IGNORED)
        self._retire(seq_group, output)
        output.ignored_seq_groups.append(seq_group)

    # ------------------------------------------------------------------ a step's results

    def update_from_output(self, out: SchedulerOutput, sampled: SampledBatch) -> StepUpdate:
        """Apply one step: ``out`` as scheduled, ``sampled`` what the sampler chose."""
        update = self._updater.apply(out, sampled)
        # A fork that preempted another request is part of this step, not the next one.
        out.preempted.extend(self._pending.preempted)
        self._pending.preempted.clear()
        return update

    def update_after_step(self, output: SchedulerOutput) -> None:
        self._updater.update_after_step(output)

    def finish_stopped(self, stopped: list[tuple[Sequence, str]]) -> None:
        self._updater.finish_stopped(stopped)

    def finish_failed(self, groups: list[SequenceGroup]) -> None:
        self._updater.finish_failed(groups)

    # ------------------------------------------------------------------ single operations

    def abort(self, request_id: str,
              status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> SequenceGroup | None:
        """Finish the request (as aborted, or ``status``) wherever it is and free its blocks
        at once.

        Returns the aborted request, or None when no such request is live (it finished
        already or never came).
        """
        seq_group = self._groups.get(request_id)
        if seq_group is None:
            return None
        for seq in seq_group.get_unfinished_seqs():
            self._finish(seq, status)
        self._retire(seq_group)
        return seq_group

    def finish_seq(self, seq: Sequence, status: SequenceStatus) -> None:
        """Finish one sequence (stop string, EOS, length) and free its blocks."""
        if not status.is_finished:
            raise ValueError(f"status must be a finished status, got {status.name}")
        seq_group = self._group_of(seq)
        if seq.status.is_finished:
            raise ValueError(f"sequence {seq.seq_id} is already {seq.status.name}")
        self._finish(seq, status)
        if seq_group.is_finished():
            self._retire(seq_group)

    def fork_seq(self, parent_seq: Sequence, seq_group: SequenceGroup,
                 new_seq_id: int | None = None, sample_index: int | None = None) -> Sequence:
        """A new running sequence in ``seq_group`` continuing ``parent_seq``'s tokens.

        Blocks are shared copy-on-write; a policy that cannot share copies them, preempting
        the latest other arrivals if it must (``update_from_output`` reports that in its own
        step; a sequence preempted after sampling still takes its sampled token).
        ``new_seq_id`` defaults to :meth:`new_seq_id`; ``sample_index`` to the parent's.
        """
        if self._group_of(parent_seq) is not seq_group or parent_seq.status is not RUNNING:
            raise ValueError(f"sequence {parent_seq.seq_id} is not running in request "
                             f"{seq_group.request_id!r}")
        seq_id = self.new_seq_id() if new_seq_id is None else new_seq_id
        if seq_id in self._seq_groups:
            raise ValueError(f"sequence id {seq_id} is already in use")
        self._next_seq_id = max(self._next_seq_id, seq_id + 1)
        while not self.block_manager.can_fork(parent_seq):
            victims = [group for group in self.running if group is not seq_group]
            if not victims:
                raise BlockAllocationError(
                    f"no device blocks left to fork sequence {parent_seq.seq_id}")
            self._preempt(victims[-1], self._pending)
        child = parent_seq.fork(seq_id, sample_index)
        self._pending.blocks_to_copy.extend(self.block_manager.fork(parent_seq, child))
        seq_group.add(child)
        self._seq_groups[child.seq_id] = seq_group
        return child

    def free_seq(self, seq: Sequence) -> None:
        """Drop a sequence from its request (a beam that fell out) and free its blocks."""
        seq_group = self._group_of(seq)
        self.block_manager.free(seq)
        seq_group.remove(seq.seq_id)
        del self._seq_groups[seq.seq_id]
        if seq_group.is_finished():
            self._retire(seq_group)

    def _group_of(self, seq: Sequence) -> SequenceGroup:
        seq_group = self._seq_groups.get(seq.seq_id)
        if seq_group is None or all(other is not seq for other in seq_group.seqs):
            raise ValueError(f"sequence {seq.seq_id} is not live in this scheduler")
        return seq_group

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        self.block_manager.free(seq)  # before the status change: it tells device from CPU
        seq.status = status
        seq.finish_reason = status.finish_reason


    # ------------------------------------------------------------------ preemption

    def _preempt(self, seq_group: SequenceGroup, output: SchedulerOutput) -> None:
        self.running.remove(seq_group)
        seq_group.metrics.num_preemptions += 1
        if self._preemption_mode(seq_group) == "swap" and self.block_manager.can_swap_out(
                seq_group):
            output.blocks_to_swap_out.extend(self.block_manager.swap_out(seq_group))
            for seq in seq_group.get_seqs(RUNNING):
                seq.status = SWAPPED
            self._insert_by_arrival(self.swapped, seq_group)
            self.preemption_stats.num_swap += 1
        else:
            # Without CPU room a swap falls back to recomputation: the request still finishes.
            for seq in seq_group.get_seqs(RUNNING):
                self.block_manager.free(seq)
                seq.reset_for_recompute()
            self._insert_by_arrival(self.waiting, seq_group)
            self.preemption_stats.num_recompute += 1
        output.preempted.append(seq_group.request_id)

    def _preemption_mode(self, seq_group: SequenceGroup) -> str:
        mode = self.config.preemption_mode
        if mode != "auto":
            return mode
        # Recomputing would drop the sharing between samples or beams; swapping keeps it.
        return "swap" if seq_group.num_seqs(RUNNING) > 1 else "recompute"

    def _arrival_of(self, seq_group: SequenceGroup) -> int:
        return self._arrival_order[seq_group.request_id]

    def _insert_by_arrival(self, queue: list[SequenceGroup], seq_group: SequenceGroup) -> None:
        order = self._arrival_order
        bisect.insort(queue, seq_group, key=lambda group: order[group.request_id])

    # ------------------------------------------------------------------ introspection

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    def get_seq_group(self, request_id: str) -> SequenceGroup | None:
        return self._groups.get(request_id)

    def num_running_seqs(self) -> int:
        """Sequences the running requests may run at once (forks still to come count)."""
        return sum(group.max_num_running_seqs() for group in self.running)

    def live_request_ids(self) -> list[str]:
        """Every request the scheduler holds, in any queue."""
        return list(self._groups)

    def arrival_index(self, request_id: str) -> int:
        """The request's place in arrival order (the queues keep this order)."""
        return self._arrival_order[request_id]

    def stats(self, with_occupancy: bool = True) -> SchedulerStats:
        """A snapshot of queues, KV usage and counters. ``with_occupancy`` adds the token
        occupancy of the running block tables (one pass over them: leave it out per step)."""
        return SchedulerStats.of(self, with_occupancy)

    def check_integrity(self) -> None:
        """Raise AssertionError unless the queues, statuses and block pools agree."""
        check_scheduler_integrity(self)
