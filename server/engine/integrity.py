"""Consistency checks of a scheduler's queues, statuses and block pools (tests call them
after every operation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedserve.server.engine.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from pagedserve.server.engine.scheduler import Scheduler

RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED
WAITING = SequenceStatus.WAITING


def check_scheduler_integrity(scheduler: Scheduler) -> None:
    """Raise AssertionError unless the queues, statuses and block pools agree."""
    queues = (scheduler.waiting, scheduler.running, scheduler.swapped)
    device_seqs = _live_seqs(scheduler.running, RUNNING)
    cpu_seqs = _live_seqs(scheduler.swapped, SWAPPED)
    if any(seq.block_table for seq in _live_seqs(scheduler.waiting, WAITING)):
        raise AssertionError("a waiting sequence holds blocks")
    queued = [group for queue in queues for group in queue]
    if sorted(g.request_id for g in queued) != sorted(scheduler._groups):
        raise AssertionError("the queues and the live requests disagree")
    for queue in queues:
        orders = [scheduler._arrival_order[group.request_id] for group in queue]
        if orders != sorted(orders):
            raise AssertionError("a queue is out of arrival order")
    if scheduler._num_running_seqs() > scheduler.config.max_num_seqs:
        raise AssertionError("more running sequences than max_num_seqs")
    scheduler.block_manager.check_integrity(device_seqs, cpu_seqs)


def _live_seqs(queue: list[SequenceGroup], status: SequenceStatus) -> list[Sequence]:
    seqs = []
    for seq_group in queue:
        for seq in seq_group.get_unfinished_seqs():
            if seq.status is not status:
                raise AssertionError(
                    f"sequence {seq.seq_id} is {seq.status.name} in a {status.name} queue")
            seqs.append(seq)
    return seqs
