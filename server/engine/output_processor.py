"""After the model: which logits rows to sample, then append, detokenize, stop, report.

Parallel sampling forks here: when a request with ``best_of > 1`` samples its first token,
the one prompt row is sampled ``best_of`` times (sample i seeded with ``seed + i``) and the
sequence is forked, so every sample shares the prompt's blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagedserve.server.engine.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from pagedserve.server.engine.sampling_params import SamplingParams
from pagedserve.server.engine.scheduler import Scheduler
from pagedserve.server.engine.scheduler_output import SchedulerOutput
from pagedserve.server.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.sampling.metadata import SamplingMetadata, SamplingRow
from pagedserve.server.sampling.sampler import Sampler
from pagedserve.server.sampling.stopping import check_stop_token
from pagedserve.server.tokenizer.base import Tokenizer
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer
from pagedserve.server.tokenizer.stop_checker import StopChecker

_STATUS_BY_REASON = {
    "stop": SequenceStatus.FINISHED_STOPPED,
    "length": SequenceStatus.FINISHED_LENGTH,
}


@dataclass(slots=True)
class _SeqState:
    index: int  # the sample's index within its request (its seed offset)
    detokenizer: IncrementalDetokenizer | None
    stop_checker: StopChecker
    logprobs: list[PositionLogprobs] | None


@dataclass(slots=True)
class _RequestState:
    group: SequenceGroup
    prompt: str | None
    metrics: RequestMetrics
    seqs: dict[int, _SeqState] = field(default_factory=dict)


@dataclass(slots=True)
class _Draw:
    """One sampler row: the sequence it extends and the sample index it stands for."""

    seq: Sequence
    state: _RequestState
    index: int
    forks: bool  # a new sample forked from ``seq`` rather than ``seq`` itself


@dataclass(slots=True)
class SamplingPlan:
    rows: list[int] = field(default_factory=list)  # hidden-state row of each sampler row
    draws: list[_Draw] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, scheduler: Scheduler, max_model_len: int,
                 vocab_size: int, eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._requests: dict[str, _RequestState] = {}
        self._touched: dict[str, _RequestState] = {}

    # -- registration ---------------------------------------------------------------------

    def register(self, group: SequenceGroup, prompt: str | None) -> None:
        state = _RequestState(group, prompt, RequestMetrics(arrival_time=group.arrival_time))
        self._requests[group.request_id] = state
        for seq in group.get_seqs():
            self._track(state, seq, index=0)

    def _track(self, state: _RequestState, seq: Sequence, index: int) -> None:
        params = state.group.sampling_params
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids,
                                                 params.skip_special_tokens)
        state.seqs[seq.seq_id] = _SeqState(
            index=index,
            detokenizer=detokenizer,
            stop_checker=StopChecker(params.stop, params.include_stop_str_in_output),
            logprobs=[] if params.logprobs is not None else None,
        )

    # -- sampling -------------------------------------------------------------------------

    def plan_sampling(self, out: SchedulerOutput, starts: list[int]) -> SamplingPlan:
        plan = SamplingPlan()
        for i, item in enumerate(out.scheduled):
            state = self._requests[item.seq_group.request_id]
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = time.monotonic()
            if not item.samples:
                continue
            row = starts[i + 1] - 1
            seq = item.seq
            params = state.group.sampling_params
            first = not seq.output_token_ids and len(state.group.seqs) == 1
            draws = params.best_of if first else 1
            for k in range(draws):
                index = k if first else state.seqs[seq.seq_id].index
                plan.rows.append(row)
                plan.draws.append(_Draw(seq, state, index, forks=k > 0))
        return plan

    def _rows(self, plan: SamplingPlan) -> list[SamplingRow]:
        eos = self.eos_token_id
        rows = []
        for d in plan.draws:
            params = d.state.group.sampling_params
            seed = None if params.seed is None else params.seed + d.index
            rows.append(SamplingRow(params=params, prompt_token_ids=d.seq.prompt_token_ids,
                                    output_token_ids=d.seq.output_token_ids, seed=seed,
                                    eos_token_id=eos))
        return rows

    def apply_samples(self, plan: SamplingPlan, logits: torch.Tensor, sampler: Sampler,
                      new_seq_id: Callable[[], int]) -> None:
        metadata = SamplingMetadata.build(self._rows(plan), self.vocab_size, logits.device)
        result = sampler(logits, metadata)
        tokens = result.sampled_token_ids.tolist()
        logprobs = result.sampled_logprobs.tolist()
        top = _top_logprobs(result)
        # Forks first: a child must copy its parent before the parent appends its own token.
        seqs = [self._fork(d, new_seq_id) if d.forks else d.seq for d in plan.draws]
        for i, (d, seq) in enumerate(zip(plan.draws, seqs)):
            position = _position_logprobs(tokens[i], logprobs[i], top, i, d.state, seq)
            self._append(d.state, seq, tokens[i], logprobs[i], position)

    def _fork(self, draw: _Draw, new_seq_id: Callable[[], int]) -> Sequence:
        child = self.scheduler.fork_seq(draw.seq, draw.state.group, new_seq_id())
        self._track(draw.state, child, draw.index)
        return child

    def _append(self, state: _RequestState, seq: Sequence, token: int, logprob: float,
                position: PositionLogprobs | None) -> None:
        params = state.group.sampling_params
        seq.append_token(token, logprob)
        now = time.monotonic()
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
        state.metrics.last_token_time = now
        seq_state = state.seqs[seq.seq_id]
        if seq_state.logprobs is not None and position is not None:
            seq_state.logprobs.append(position)
        reason, stop_reason = check_stop_token(params, len(seq.output_token_ids), token,
                                               self.eos_token_id)
        if reason is None and len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if self.tokenizer is not None:
            matched = self._update_text(seq, seq_state, params, ended=reason is not None)
            if matched is not None:
                reason, stop_reason = "stop", matched
        if reason is not None:
            seq.stop_reason = stop_reason
            self.scheduler.finish_seq(seq, _STATUS_BY_REASON[reason])
        self._touched[state.group.request_id] = state

    @staticmethod
    def _update_text(seq: Sequence, seq_state: _SeqState, params: SamplingParams,
                     ended: bool) -> str | None:
        """Appends the new token's text; returns the stop string it completed, if any."""
        delta = seq_state.detokenizer.add_tokens(seq.output_token_ids[-1:])
        if ended:
            delta += seq_state.detokenizer.flush()
        if len(seq.output_token_ids) < params.min_tokens or not params.stop:
            # Stop strings only count from min_tokens on; before that text passes through.
            seq.output_text += delta
            return None
        emit, matched = seq_state.stop_checker.feed(delta)
        seq.output_text += emit
        if matched is None and ended:
            seq.output_text += seq_state.stop_checker.flush()
        return matched

    # -- results --------------------------------------------------------------------------

    def finish_aborted(self, group: SequenceGroup) -> RequestOutput | None:
        state = self._requests.pop(group.request_id, None)
        self._touched.pop(group.request_id, None)
        if state is None:
            return None
        for seq in group.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
        return self._output(state, finished=True)

    def collect(self) -> list[RequestOutput]:
        """Outputs of the requests that changed since the last call."""
        results = []
        for request_id, state in self._touched.items():
            finished = state.group.is_finished()
            results.append(self._output(state, finished))
            if finished:
                del self._requests[request_id]
        self._touched.clear()
        return results

    def _output(self, state: _RequestState, finished: bool) -> RequestOutput:
        group = state.group
        params = group.sampling_params
        seqs = sorted(group.seqs, key=lambda s: state.seqs[s.seq_id].index)
        if finished:
            state.metrics.finished_time = time.monotonic()
            if params.best_of > params.n:
                seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:params.n]
        elif params.best_of > params.n:
            seqs = []  # best-of results are known only at the end
        outputs = [
            CompletionOutput(
                index=i if params.best_of > params.n else state.seqs[s.seq_id].index,
                text=s.output_text,
                token_ids=list(s.output_token_ids),
                cumulative_logprob=s.cumulative_logprob,
                logprobs=state.seqs[s.seq_id].logprobs,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for i, s in enumerate(seqs)
        ]
        return RequestOutput(
            request_id=group.request_id,
            prompt=state.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            metrics=state.metrics,
            num_cached_tokens=max((s.num_cached_tokens for s in group.seqs), default=0),
        )


def _top_logprobs(result: object) -> tuple[list[list[int]], list[list[float]]] | None:
    top = getattr(result, "top_logprobs", None)
    if top is None:
        return None
    ids, values = top
    return ids.tolist(), values.tolist()


def _position_logprobs(token: int, logprob: float,
                       top: tuple[list[list[int]], list[list[float]]] | None, row: int,
                       state: _RequestState, seq: Sequence) -> PositionLogprobs | None:
    k = state.group.sampling_params.logprobs
    if k is None:
        return None
    position: PositionLogprobs = {}
    if top is not None:
        for rank, (tid, value) in enumerate(zip(top[0][row][:k], top[1][row][:k]), start=1):
            position[tid] = Logprob(value, rank)
    if token not in position:
        ranks = top[1][row] if top is not None else []
        rank = 1 + sum(1 for v in ranks if v > logprob) if top is not None else None
        position[token] = Logprob(logprob, rank)
    del seq
    return position
