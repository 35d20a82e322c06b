"""The scheduler's other half: every change a step's results make to sequences and requests.

``update_from_output`` applies what the sampler chose: it advances the computed tokens,
forks new samples and beams, appends tokens, records when each token was produced, finishes
sequences on EOS, a stop token or a length limit, and frees their blocks. Preemptions a fork
causes are reported in the same step's ``SchedulerOutput``. ``finish_stopped`` and
``finish_failed`` apply what the output processor found (stop strings, a request whose
post-processing raised). Nothing outside the scheduler and the block manager changes a
sequence, a request or a block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput, StepUpdate
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.errors import BlockAllocationError
from pagedserve.server.sampling.stop_conditions import check_stop_token

if TYPE_CHECKING:
    from pagedserve.server.engine.core.scheduler_output import BeamStep, SampledBatch, SampledToken

RUNNING = SequenceStatus.RUNNING
_STATUS_BY_REASON = {
    "stop": SequenceStatus.FINISHED_STOPPED,
    "length": SequenceStatus.FINISHED_LENGTH,
}


class SchedulerUpdates:
    """Mixed into ``Scheduler``; uses its queues, block manager and bookkeeping."""

    # -- one step's results ---------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, sampled: SampledBatch) -> StepUpdate:
        """Apply one step: ``out`` as scheduled, ``sampled`` what the sampler chose."""
        self.update_after_step(out)
        update = StepUpdate()
        now = self._clock()
        for group, positions in sampled.prompt_positions:
            group.prompt_logprobs.extend(positions)
        # Forks first: a child must copy its parent before the parent appends its own token.
        seqs = [self.fork_seq(t.draw.seq, t.draw.group, sample_index=t.draw.index)
                if t.draw.forks else t.draw.seq for t in sampled.tokens]
        for token, seq in zip(sampled.tokens, seqs):
            self._append(seq, token, now, update)
        for beam_step in sampled.beams:
            self._step_beams(beam_step, now, update)
        for group in out.ignored_seq_groups:
            update.touch(group)
        # A fork that preempted another request is part of this step, not the next one.
        out.preempted.extend(self._pending.preempted)
        self._pending.preempted.clear()
        return update

    def update_after_step(self, output: SchedulerOutput) -> None:
        """Advance each scheduled sequence by the tokens the step computed, and offer newly
        full blocks to the prefix cache. Call before appending the sampled tokens."""
        for item in output.scheduled:
            seq = item.seq
            if seq.status is not RUNNING:
                continue  # finished or aborted while the step ran
            if seq.num_computed_tokens != item.num_computed_tokens:
                raise RuntimeError(f"sequence {seq.seq_id} was already advanced past this step")
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_computed_blocks(seq, item.seq_group.cache_salt)

    def _append(self, seq: Sequence, token: SampledToken, now: float,
                update: StepUpdate) -> None:
        group = token.draw.group
        if seq.grammar is not None and not seq.grammar.accept(token.token_id):
            # Only a mask that left no token (min_tokens holding back the only stop the
            # grammar allows) samples outside it; the output so far is all there is.
            update.touch(group)
            self.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
            return
        seq.append_token(token.token_id, token.logprob)
        _mark_token(group, now, update)
        if token.position is not None:
            update.logprob_seqs.append(seq)
            update.logprobs.append(token.position)
        reason, stop_reason = check_stop_token(group.sampling_params, seq.num_output_tokens,
                                               token.token_id, group.eos_token_id)
        if reason is None and seq.num_tokens >= self.config.max_model_len:
            reason = "length"
        if reason is None and seq.grammar is not None and seq.grammar.is_terminated:
            reason = "stop"  # the grammar's stop token under ignore_eos: nothing may follow
        if reason is not None and not seq.status.is_finished:
            seq.stop_reason = stop_reason
            self.finish_seq(seq, _STATUS_BY_REASON[reason])

    def _step_beams(self, beam_step: BeamStep, now: float, update: StepUpdate) -> None:
        group, beams = beam_step.group, beam_step.beams
        kept = group.beam.step([b.output_token_ids for b in beams],
                               [b.cumulative_logprob for b in beams], beam_step.candidates)
        _mark_token(group, now, update)
        if group.beam.done:
            for beam in beams:
                self.finish_seq(beam, SequenceStatus.FINISHED_STOPPED)
            return
        children: dict[int, list] = {}
        for continuation in kept:
            children.setdefault(continuation.parent, []).append(continuation)
        for i, beam in enumerate(beams):  # drop first: their blocks serve the forks
            if i not in children:
                self.free_seq(beam)
        for i, continuations in children.items():
            parent = beams[i]
            for continuation in continuations[1:]:
                child = self.fork_seq(parent, group)
                child.append_token(continuation.token_id, continuation.logprob)
            parent.append_token(continuations[0].token_id, continuations[0].logprob)

    # -- what the output processor found --------------------------------------------------

    def finish_stopped(self, stopped: list[tuple[Sequence, str]]) -> None:
        """Finish each sequence whose text reached a stop string (which names the reason,
        even when the same token also ended it another way)."""
        for seq, stop in stopped:
            if seq.status.is_finished:
                seq.status = SequenceStatus.FINISHED_STOPPED
                seq.finish_reason = "stop"
            else:
                self.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
            seq.stop_reason = stop

    def finish_failed(self, groups: list[SequenceGroup]) -> None:
        """End requests whose post-processing raised (finish_reason "error"), freeing their
        blocks; the other requests go on."""
        for group in groups:
            for seq in group.get_unfinished_seqs():
                self._finish(seq, SequenceStatus.FINISHED_ERROR)
            if group.request_id in self._groups:
                self._retire(group)

    # -- single operations ----------------------------------------------------------------

    def abort(self, request_id: str) -> SequenceGroup | None:
        """Finish the request as aborted wherever it is and free its blocks at once.

        Returns the aborted request, or None when no such request is live (it finished
        already or never came).
        """
        seq_group = self._groups.get(request_id)
        if seq_group is None:
            return None
        for seq in seq_group.get_unfinished_seqs():
            self._finish(seq, SequenceStatus.FINISHED_ABORTED)
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


def _mark_token(group: SequenceGroup, now: float, update: StepUpdate) -> None:
    """Record when the request's newest token was produced (once per step)."""
    metrics = group.metrics
    if metrics.first_token_time is None:
        metrics.first_token_time = now
    metrics.last_token_time = now
    update.touch(group)
