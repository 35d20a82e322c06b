"""Applying a step's results to the scheduler's sequences and requests (``StepUpdater``).

``apply`` takes what the sampler chose: it advances the computed tokens, forks new samples
and beams, appends tokens, records when each token was produced, finishes sequences on EOS,
a stop token or a length limit, and frees their blocks. ``finish_stopped`` and
``finish_failed`` apply what the output processor found (stop strings, a request whose
post-processing raised). The scheduler owns one updater and delegates to it; the updater
changes requests only through the scheduler's own operations (fork, finish, free), so the
queues and id tables have one keeper. Nothing outside the scheduler and the block manager
changes a sequence, a request or a block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput, StepUpdate
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.sampling.stop_conditions import check_stop_token

if TYPE_CHECKING:
    from pagedserve.server.engine.core.beam_search import BeamContinuation
    from pagedserve.server.engine.core.scheduler import Scheduler
    from pagedserve.server.engine.core.scheduler_output import BeamStep, SampledBatch, SampledToken

logger = logging.getLogger(__name__)

RUNNING = SequenceStatus.RUNNING
_STATUS_BY_REASON = {
    "stop": SequenceStatus.FINISHED_STOPPED,
    "length": SequenceStatus.FINISHED_LENGTH,
}


class StepUpdater:

    """Applies sampled tokens and output-processor findings through ``scheduler``'s
    operations; ``clock`` times each request's tokens."""

    def __init__(self, scheduler: Scheduler,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._scheduler = scheduler
        self._block_manager = scheduler.block_manager
        self._max_model_len = scheduler.config.max_model_len
        self._clock = clock

    # -- one step's results ---------------------------------------------------------------

    def apply(self, out: SchedulerOutput, sampled: SampledBatch) -> StepUpdate:
        """Apply one step: ``out`` as scheduled, ``sampled`` what the sampler chose."""
        self.update_after_step(out)
        update = StepUpdate()
        now = self._clock()
        scheduler = self._scheduler
        for group, positions in sampled.prompt_positions:
            reported = group.prompt_logprobs
            assert reported is not None, "only a request that asked for them gets them"
            reported.extend(positions)
        # Forks first: a child must copy its parent before the parent appends its own token.
        seqs = [scheduler.fork_seq(t.draw.seq, t.draw.group, sample_index=t.draw.index)
                if t.draw.forks else t.draw.seq for t in sampled.tokens]
        for token, seq in zip(sampled.tokens, seqs):
            self._append(seq, token, now, update)
        for beam_step in sampled.beams:
            self._step_beams(beam_step, now, update)
        for group in out.ignored_seq_groups:
            update.touch(group)
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
            self._block_manager.cache_computed_blocks(seq, item.seq_group.cache_salt)

    def _append(self, seq: Sequence, token: SampledToken, now: float,
                update: StepUpdate) -> None:
        group = token.draw.group
        if seq.grammar is not None and not seq.grammar.accept(token.token_id):
            self._reject(seq, group, seq.grammar.is_completed, token.token_id, update)
            return
        seq.append_token(token.token_id, token.logprob)
        _mark_token(group, now, update)
        if token.position is not None:
            update.logprob_seqs.append(seq)
            update.logprobs.append(token.position)
        reason, stop_reason = check_stop_token(group.sampling_params, seq.num_output_tokens,
                                               token.token_id, group.eos_token_id)
        if reason is None and seq.num_tokens >= self._max_model_len:
            reason = "length"
        if reason is None and seq.grammar is not None and seq.grammar.is_terminated:
            reason = "stop"  # the grammar's stop token under ignore_eos: nothing may follow
        if reason is not None and not seq.status.is_finished:
            seq.stop_reason = stop_reason
            self._scheduler.finish_seq(seq, _STATUS_BY_REASON[reason])

    def _reject(self, seq: Sequence, group: SequenceGroup, complete: bool, token_id: int,
                update: StepUpdate) -> None:
        """End a sequence whose sampled token its grammar forbids (``complete``: the output
        so far is a whole string of the grammar). A mask that left no token (min_tokens
        holding back the only stop a complete output allows) ends a complete output: "stop".
        Anything else is a fault of the sampler: the output is cut short, and "stop" would
        pass it off as valid, so it ends with "error"."""
        update.touch(group)
        if complete:
            self._scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
            return
        logger.error("request %s sampled token %d, which its grammar forbids after %d tokens",
                     group.request_id, token_id, seq.num_output_tokens)
        self._scheduler.finish_seq(seq, SequenceStatus.FINISHED_ERROR)

    def _step_beams(self, beam_step: BeamStep, now: float, update: StepUpdate) -> None:
        group, beams, state = beam_step.group, beam_step.beams, beam_step.group.beam
        assert state is not None, "a beam step's request runs beam search"
        kept = state.step([b.output_token_ids for b in beams],
                          [b.cumulative_logprob for b in beams], beam_step.candidates)
        _mark_token(group, now, update)
        if state.done:
            for beam in beams:
                self._scheduler.finish_seq(beam, SequenceStatus.FINISHED_STOPPED)
            return
        children: dict[int, list[BeamContinuation]] = {}
        for continuation in kept:
            children.setdefault(continuation.parent, []).append(continuation)
        for i, beam in enumerate(beams):  # drop first: their blocks serve the forks
            if i not in children:
                self._scheduler.free_seq(beam)
        for i, continuations in children.items():
            parent = beams[i]
            for continuation in continuations[1:]:
                child = self._scheduler.fork_seq(parent, group)
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
                self._scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
            seq.stop_reason = stop

    def finish_failed(self, groups: list[SequenceGroup]) -> None:
        """End requests whose post-processing raised (finish_reason "error"), freeing their
        blocks; the other requests go on."""
        for group in groups:
            self._scheduler.abort(group.request_id, SequenceStatus.FINISHED_ERROR)


def _mark_token(group: SequenceGroup, now: float, update: StepUpdate) -> None:
    """Record when the request's newest token was produced (once per step)."""
    metrics = group.metrics
    if metrics.first_token_time is None:
        metrics.first_token_time = now
    metrics.last_token_time = now
    update.touch(group)
