"""After the model: which logits rows to sample, then append, detokenize, stop, report.

Parallel sampling forks here: when a request with ``best_of > 1`` samples its first token,
the one prompt row is sampled ``best_of`` times (sample i seeded with ``seed + i``) and the
sequence is forked, so every sample shares the prompt's blocks. Beam search requests rank
their beams with :class:`BeamState` and fork or free beams to match.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagedserve.server.engine.beam_search import BeamContinuation, BeamState
from pagedserve.server.engine.outputs import (
    Logprob,
    PositionLogprobs,
    RequestOutput,
)
from pagedserve.server.engine.prompt_logprobs import PromptChunk, prompt_logprobs
from pagedserve.server.engine.request_state import RequestState
from pagedserve.server.engine.scheduler import Scheduler
from pagedserve.server.engine.scheduler_output import SchedulerOutput
from pagedserve.server.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.errors import InvalidRequestError
from pagedserve.server.sampling.metadata import SamplingMetadata, SamplingRow
from pagedserve.server.sampling.sampler import Sampler, SamplerOutput
from pagedserve.server.sampling.stopping import check_stop_token
from pagedserve.server.sampling_params import SamplingParams
from pagedserve.server.tokenizer.base import Tokenizer

_STATUS_BY_REASON = {
    "stop": SequenceStatus.FINISHED_STOPPED,
    "length": SequenceStatus.FINISHED_LENGTH,
}


@dataclass(slots=True)
class _Draw:
    """One sampler row: the sequence it extends and the sample index it stands for."""

    seq: Sequence
    state: RequestState
    index: int
    forks: bool  # a new sample forked from ``seq`` rather than ``seq`` itself


@dataclass(slots=True)
class SamplingPlan:
    """Logits rows in order: sampled draws, then beams grouped by request, then prompt
    positions whose logprobs were asked for."""

    rows: list[int] = field(default_factory=list)  # hidden-state row of each draw
    draws: list[_Draw] = field(default_factory=list)
    beams: dict[str, list[tuple[Sequence, int]]] = field(default_factory=dict)
    prompt_chunks: list[PromptChunk] = field(default_factory=list)

    @property
    def num_sampled(self) -> int:
        return len(self.draws) + sum(len(b) for b in self.beams.values())

    def logit_rows(self) -> list[int]:
        rows = list(self.rows)
        rows.extend(row for beams in self.beams.values() for _, row in beams)
        for chunk in self.prompt_chunks:
            rows.extend(chunk.rows)
        return rows


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, scheduler: Scheduler, max_model_len: int,
                 vocab_size: int, eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._requests: dict[str, RequestState] = {}
        self._touched: dict[str, RequestState] = {}

    # -- registration ---------------------------------------------------------------------

    def register(self, group: SequenceGroup, prompt: str | None) -> None:
        params = group.sampling_params
        state = RequestState(group, prompt, group.metrics,
                             bad_words_token_ids=self.bad_words_token_ids(params))
        if params.use_beam_search:
            eos = frozenset() if self.eos_token_id is None else frozenset([self.eos_token_id])
            max_tokens = min(params.max_tokens, self.max_model_len - len(group.prompt_token_ids))
            state.beam = BeamState.from_params(params, eos, max_tokens)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self._requests[group.request_id] = state
        for seq in group.get_seqs():
            state.new_seq_state(seq, 0, self.tokenizer)

    def bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """Each bad word as token ids, alone and after a space (as it appears mid-text)."""
        if not params.bad_words:
            return []
        if self.tokenizer is None:
            raise InvalidRequestError("bad_words needs a tokenizer", param="bad_words")
        sequences = []
        for word in params.bad_words:
            for text in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    # -- planning -------------------------------------------------------------------------

    def plan_sampling(self, out: SchedulerOutput, starts: list[int]) -> SamplingPlan:
        plan = SamplingPlan()
        for i, item in enumerate(out.scheduled):
            state = self._requests[item.seq_group.request_id]
            if state.prompt_logprobs is not None:
                chunk = PromptChunk.of(state, item, starts[i])
                if chunk is not None:
                    plan.prompt_chunks.append(chunk)
            if item.samples:
                self._plan_row(plan, state, item.seq, starts[i + 1] - 1)
        return plan

    def _plan_row(self, plan: SamplingPlan, state: RequestState, seq: Sequence,
                  row: int) -> None:
        if state.beam is not None:
            plan.beams.setdefault(state.group.request_id, []).append((seq, row))
            return
        params = state.group.sampling_params
        first = not seq.output_token_ids and len(state.group.seqs) == 1
        for k in range(params.best_of if first else 1):
            plan.rows.append(row)
            plan.draws.append(_Draw(seq, state, k if first else state.seqs[seq.seq_id].index,
                                    forks=k > 0))

    # -- applying samples -----------------------------------------------------------------

    def apply(self, plan: SamplingPlan, logits: torch.Tensor, sampler: Sampler,
              new_seq_id: Callable[[], int]) -> None:
        n_draws = len(plan.draws)
        n_beams = plan.num_sampled - n_draws
        if n_draws:
            self._apply_draws(plan, logits[:n_draws], sampler, new_seq_id)
        if n_beams:
            self._apply_beams(plan, logits[n_draws:n_draws + n_beams], sampler, new_seq_id)
        if plan.prompt_chunks:
            prompt_logprobs(plan.prompt_chunks, logits[n_draws + n_beams:])

    def _sampling_rows(self, seqs: list[Sequence], states: list[RequestState],
                       seeds: list[int | None]) -> list[SamplingRow]:
        return [SamplingRow(params=state.group.sampling_params,
                            prompt_token_ids=s.prompt_token_ids,
                            output_token_ids=s.output_token_ids, seed=seed,
                            eos_token_id=self.eos_token_id,
                            bad_words_token_ids=state.bad_words_token_ids)
                for s, state, seed in zip(seqs, states, seeds)]

    def _apply_draws(self, plan: SamplingPlan, logits: torch.Tensor, sampler: Sampler,
                     new_seq_id: Callable[[], int]) -> None:
        params = [d.state.group.sampling_params for d in plan.draws]
        seeds = [None if p.seed is None else p.seed + d.index for p, d in zip(params, plan.draws)]
        rows = self._sampling_rows([d.seq for d in plan.draws], [d.state for d in plan.draws],
                                   seeds)
        result = sampler(logits, SamplingMetadata.build(rows, self.vocab_size, logits.device))
        tokens = result.sampled_token_ids.tolist()
        logprobs = result.sampled_logprobs.tolist()
        positions = _position_logprobs(result, params)
        # Forks first: a child must copy its parent before the parent appends its own token.
        seqs = [self._fork(d.seq, d.state, d.index, new_seq_id) if d.forks else d.seq
                for d in plan.draws]
        for i, (draw, seq) in enumerate(zip(plan.draws, seqs)):
            self._append(draw.state, seq, tokens[i], logprobs[i], positions[i])

    def _fork(self, parent: Sequence, state: RequestState, index: int,
              new_seq_id: Callable[[], int]) -> Sequence:
        child = self.scheduler.fork_seq(parent, state.group, new_seq_id())
        state.seqs[child.seq_id] = state.seqs[parent.seq_id].fork(index)
        return child

    def _append(self, state: RequestState, seq: Sequence, token: int, logprob: float,
                position: PositionLogprobs | None) -> None:
        params = state.group.sampling_params
        seq.append_token(token, logprob)
        self._mark_token(state)
        seq_state = state.seqs[seq.seq_id]
        if seq_state.logprobs is not None and position is not None:
            seq_state.logprobs.append(position)
        reason, stop_reason = check_stop_token(params, len(seq.output_token_ids), token,
                                               self.eos_token_id)
        if reason is None and len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if self.tokenizer is not None:
            matched = _update_text(seq, seq_state, params, ended=reason is not None)
            if matched is not None:
                reason, stop_reason = "stop", matched
        if reason is not None:
            seq.stop_reason = stop_reason
            self.scheduler.finish_seq(seq, _STATUS_BY_REASON[reason])

    def _mark_token(self, state: RequestState) -> None:
        now = time.monotonic()
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
        state.metrics.last_token_time = now
        self._touched[state.group.request_id] = state

    # -- beam search ----------------------------------------------------------------------

    def _apply_beams(self, plan: SamplingPlan, logits: torch.Tensor, sampler: Sampler,
                     new_seq_id: Callable[[], int]) -> None:
        seqs = [seq for beams in plan.beams.values() for seq, _ in beams]
        states = [self._requests[rid] for rid, beams in plan.beams.items() for _ in beams]
        rows = self._sampling_rows(seqs, states, [None] * len(seqs))
        logprobs = sampler.compute_logprobs(
            logits, SamplingMetadata.build(rows, self.vocab_size, logits.device))
        offset = 0
        for request_id, beam_rows in plan.beams.items():
            beams = [seq for seq, _ in beam_rows]
            state = self._requests[request_id]
            group_logprobs = logprobs[offset:offset + len(beams)]
            offset += len(beams)
            kept = state.beam.step([b.output_token_ids for b in beams],
                                   [b.cumulative_logprob for b in beams], group_logprobs)
            self._rebuild_beams(state, beams, kept, new_seq_id)

    def _rebuild_beams(self, state: RequestState, beams: list[Sequence],
                       kept: list[BeamContinuation], new_seq_id: Callable[[], int]) -> None:
        self._mark_token(state)
        if state.beam.done:
            for beam in beams:
                self.scheduler.finish_seq(beam, SequenceStatus.FINISHED_STOPPED)
            return
        children: dict[int, list[BeamContinuation]] = {}
        for continuation in kept:
            children.setdefault(continuation.parent, []).append(continuation)
        for i, beam in enumerate(beams):  # drop first: their blocks serve the forks
            if i not in children:
                state.seqs.pop(beam.seq_id, None)
                self.scheduler.free_seq(beam)
        for i, conts in children.items():
            parent = beams[i]
            for cont in conts[1:]:
                child = self._fork(parent, state, 0, new_seq_id)
                child.append_token(cont.token_id, cont.logprob)
            parent.append_token(conts[0].token_id, conts[0].logprob)

    # -- results --------------------------------------------------------------------------

    def finish_aborted(self, group: SequenceGroup) -> RequestOutput | None:
        state = self._requests.pop(group.request_id, None)
        self._touched.pop(group.request_id, None)
        if state is None:
            return None
        for seq in group.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
        return state.to_output(True, self.tokenizer)

    def finish_ignored(self, groups: list[SequenceGroup]) -> None:
        """Requests the scheduler gave up on (they outgrew the cache while preempted)."""
        for group in groups:
            state = self._requests.get(group.request_id)
            if state is not None:
                self._touched[group.request_id] = state

    def collect(self) -> list[RequestOutput]:
        """Outputs of the requests that changed since the last call."""
        results = []
        for request_id, state in self._touched.items():
            finished = state.group.is_finished()
            output = state.to_output(finished, self.tokenizer)
            if finished or output.outputs:
                results.append(output)
            if finished:
                del self._requests[request_id]
        self._touched.clear()
        return results


def _update_text(seq: Sequence, seq_state, params: SamplingParams, ended: bool) -> str | None:
    """Appends the new token's text; returns the stop string it completed, if any."""
    delta = seq_state.detokenizer.add_tokens(seq.output_token_ids[-1:])
    if ended:
        delta += seq_state.detokenizer.flush()
    if len(seq.output_token_ids) < params.min_tokens or not params.stop:
        # Stop strings count only from min_tokens on; before that text passes through.
        seq.output_text += delta
        return None
    emit, matched = seq_state.stop_checker.feed(delta)
    seq.output_text += emit
    if matched is None and ended:
        seq.output_text += seq_state.stop_checker.flush()
    return matched


def _position_logprobs(result: SamplerOutput, params: list[SamplingParams]
                       ) -> list[PositionLogprobs | None]:
    """Per row: the sampled token's logprob and rank plus the top-k the request asked for."""
    if result.sampled_ranks is None:
        return [None] * len(params)
    tokens = result.sampled_token_ids.tolist()
    logprobs = result.sampled_logprobs.tolist()
    ranks = result.sampled_ranks.tolist()
    top_ids, top_values = ([], []) if result.top_logprobs is None else (
        result.top_logprobs[0].tolist(), result.top_logprobs[1].tolist())
    positions: list[PositionLogprobs | None] = []
    for i, p in enumerate(params):
        if p.logprobs is None:
            positions.append(None)
            continue
        position = {tokens[i]: Logprob(logprobs[i], ranks[i])}
        if p.logprobs:
            for rank, (tid, value) in enumerate(zip(top_ids[i][:p.logprobs],
                                                    top_values[i][:p.logprobs]), start=1):
                position.setdefault(tid, Logprob(value, rank))
        positions.append(position)
    return positions
