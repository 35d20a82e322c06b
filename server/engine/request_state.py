"""What the engine keeps per request between steps, and the RequestOutput built from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pagedserve.server.engine.beam_search import BeamState
from pagedserve.server.engine.outputs import (
    CompletionOutput,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from pagedserve.server.engine.sequence import Sequence, SequenceGroup
from pagedserve.server.sampling.stopping import StopChecker
from pagedserve.server.tokenizer.base import Tokenizer
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass(slots=True)
class SeqState:
    """Per sample or beam: its index (seed offset, output index) and its text state."""

    index: int
    detokenizer: IncrementalDetokenizer | None
    stop_checker: StopChecker
    logprobs: list[PositionLogprobs] | None

    def fork(self, index: int) -> SeqState:
        return SeqState(
            index=index,
            detokenizer=None if self.detokenizer is None else self.detokenizer.fork(),
            stop_checker=self.stop_checker.fork(),
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )


@dataclass(slots=True)
class RequestState:
    group: SequenceGroup
    prompt: str | None
    metrics: RequestMetrics
    seqs: dict[int, SeqState] = field(default_factory=dict)
    beam: BeamState | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    bad_words_token_ids: list[list[int]] = field(default_factory=list)

    def new_seq_state(self, seq: Sequence, index: int, tokenizer: Tokenizer | None) -> SeqState:
        params = self.group.sampling_params
        detokenizer = None
        if tokenizer is not None:
            detokenizer = IncrementalDetokenizer(tokenizer, seq.prompt_token_ids,
                                                 params.skip_special_tokens)
        state = SeqState(index, detokenizer,
                         StopChecker(params.stop, params.include_stop_str_in_output),
                         [] if params.logprobs is not None else None)
        self.seqs[seq.seq_id] = state
        return state

    def to_output(self, finished: bool, tokenizer: Tokenizer | None) -> RequestOutput:
        if finished:
            self.metrics.finished_time = time.monotonic()
        outputs = self._beam_outputs(tokenizer) if self.beam is not None \
            else self._sample_outputs(finished)
        return RequestOutput(
            request_id=self.group.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.group.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            metrics=self.metrics,
            prompt_logprobs=self.prompt_logprobs,
            num_cached_tokens=max((s.num_cached_tokens for s in self.group.seqs), default=0),
        )

    def _sample_outputs(self, finished: bool) -> list[CompletionOutput]:
        params = self.group.sampling_params
        seqs = sorted(self.group.seqs, key=lambda s: self.seqs[s.seq_id].index)
        ranked = params.best_of > params.n
        # The sampler skips the sampled token's logprob unless logprobs or ranking need it.
        tracked = ranked or params.logprobs is not None
        if ranked:
            # best-of results exist only at the end: the n highest cumulative logprobs.
            seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:params.n] \
                if finished else []
        return [
            CompletionOutput(
                index=i if ranked else self.seqs[s.seq_id].index,
                text=s.output_text,
                token_ids=list(s.output_token_ids),
                cumulative_logprob=s.cumulative_logprob if tracked else None,
                logprobs=self.seqs[s.seq_id].logprobs,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for i, s in enumerate(seqs)
        ]

    def _beam_outputs(self, tokenizer: Tokenizer | None) -> list[CompletionOutput]:
        if not self.group.is_finished():
            return []  # beams are re-ranked every step: results exist only at the end
        params = self.group.sampling_params
        live = [s for s in self.group.seqs if s.status.is_finished]
        hypotheses = self.beam.results([s.output_token_ids for s in live],
                                       [s.cumulative_logprob for s in live])
        return [
            CompletionOutput(
                index=i,
                text="" if tokenizer is None else tokenizer.decode(
                    h.token_ids, skip_special_tokens=params.skip_special_tokens),
                token_ids=h.token_ids,
                cumulative_logprob=h.cumulative_logprob,
                logprobs=None,
                finish_reason=h.finish_reason,
            )
            for i, h in enumerate(hypotheses[:params.n])
        ]
