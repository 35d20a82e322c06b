"""After the scheduler applied a step: detokenize, match stop strings, build RequestOutputs.

The output processor holds no scheduler and changes no sequence or request: it writes only
each sequence's text record (``seq.text``) and reports back, as lists, the sequences whose
text reached a stop string and the requests whose post-processing raised. The engine hands
both to the scheduler, which finishes them and frees their blocks in the same step.

One request's failure is that request's failure: an exception while detokenizing, matching
stop strings or building one request's output ends that request with ``finish_reason``
"error" (``RequestOutput.error`` says why) and every other request goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.outputs import (
    CompletionOutput,
    PositionLogprobs,
    RequestOutput,
)
from pagedserve.server.engine.core.scheduler_output import StepUpdate
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.core.text_state import TextState
from pagedserve.server.sampling.stop_conditions import StopChecker
from pagedserve.server.tokenizer.base import Tokenizer
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepOutputs:
    """One step's outputs, and what the scheduler must finish because of them."""

    results: list[RequestOutput] = field(default_factory=list)
    stopped: list[tuple[Sequence, str]] = field(default_factory=list)  # (sequence, stop string)
    failed: list[SequenceGroup] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer

    def text_state(self, prompt_token_ids: list[int], params: SamplingParams) -> TextState:
        """A new sequence's text record."""
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_token_ids,
                                                 params.skip_special_tokens)
        return TextState(detokenizer,
                         StopChecker(params.stop, params.include_stop_str_in_output),
                         [] if params.logprobs is not None else None)

    # -- the step -------------------------------------------------------------------------

    def make(self, update: StepUpdate) -> StepOutputs:
        """Outputs of the requests the step changed, each processed on its own."""
        made = StepOutputs()
        logprobs: dict[int, list[PositionLogprobs]] = {}
        for seq, position in zip(update.logprob_seqs, update.logprobs):
            logprobs.setdefault(seq.seq_id, []).append(position)
        for group in update.groups.values():
            try:
                stopped = self._process(group, logprobs)
                output = self._output(group, dict(stopped))
            except Exception as exc:  # this request's failure, not the engine's
                logger.exception("post-processing request %s failed", group.request_id)
                made.failed.append(group)
                made.results.append(self._error_output(group, exc))
                continue
            made.stopped.extend(stopped)
            if output is not None:
                made.results.append(output)
        return made

    def final_output(self, group: SequenceGroup) -> RequestOutput:
        """The last output of a request that ended between steps (aborted)."""
        try:
            output = self._output(group, {})
        except Exception as exc:
            logger.exception("building the output of request %s failed", group.request_id)
            return self._error_output(group, exc)
        return output if output is not None else self._error_output(group, None)

    def _process(self, group: SequenceGroup, logprobs: dict[int, list[PositionLogprobs]]
                 ) -> list[tuple[Sequence, str]]:
        """Append each sequence's new logprobs and text; return the stop-string hits."""
        stopped = []
        for seq in group.seqs:
            text = seq.text
            if text is None:
                continue
            if text.logprobs is not None:
                text.logprobs.extend(logprobs.get(seq.seq_id, ()))
            if group.beam is not None or text.detokenizer is None:
                continue  # beams are decoded whole at the end
            matched = _update_text(seq, text, group.sampling_params)
            if matched is not None:
                stopped.append((seq, matched))
        return stopped

    # -- outputs --------------------------------------------------------------------------

    def _output(self, group: SequenceGroup, stopped: dict[Sequence, str]
                ) -> RequestOutput | None:
        finished = all(s.is_finished() or s in stopped for s in group.seqs)
        outputs = self._beam_outputs(group) if group.beam is not None \
            else _sample_outputs(group, stopped, finished)
        if not (finished or outputs):
            return None
        return self._request_output(group, outputs, finished)

    def _request_output(self, group: SequenceGroup, outputs: list[CompletionOutput],
                        finished: bool, error: str | None = None) -> RequestOutput:
        # A snapshot: the request's own record keeps changing after this output is sent.
        metrics = group.metrics.snapshot()
        if finished:
            metrics.finished_time = time.monotonic()
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            metrics=metrics,
            prompt_logprobs=group.prompt_logprobs,
            num_cached_tokens=max((s.num_cached_tokens for s in group.seqs), default=0),
            error=error,
        )

    def _error_output(self, group: SequenceGroup, exc: BaseException | None) -> RequestOutput:
        outputs = [CompletionOutput(index=s.sample_index, text="",
                                    token_ids=list(s.output_token_ids), cumulative_logprob=None,
                                    logprobs=None, finish_reason="error")
                   for s in group.seqs]
        reason = "no output" if exc is None else f"{type(exc).__name__}: {exc}"
        return self._request_output(group, outputs, True,
                                    error=f"processing the request's output failed ({reason})")

    def _beam_outputs(self, group: SequenceGroup) -> list[CompletionOutput]:
        if not group.is_finished() or group.beam is None:
            return []  # beams are re-ranked every step: results exist only at the end
        params = group.sampling_params
        live = [s for s in group.seqs if s.status.is_finished]
        hypotheses = group.beam.results([s.output_token_ids for s in live],
                                        [s.cumulative_logprob for s in live])
        tokenizer = self.tokenizer
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


def _sample_outputs(group: SequenceGroup, stopped: dict[Sequence, str],
                    finished: bool) -> list[CompletionOutput]:
    params = group.sampling_params
    seqs = sorted(group.seqs, key=lambda s: s.sample_index)
    ranked = params.num_samples > params.n
    # The sampler skips the sampled token's logprob unless logprobs or ranking need it.
    tracked = ranked or params.logprobs is not None
    if ranked:
        # best-of results exist only at the end: the n highest cumulative logprobs.
        seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:params.n] \
            if finished else []
    return [
        CompletionOutput(
            index=i if ranked else s.sample_index,
            text=s.text.text if s.text is not None else "",
            token_ids=list(s.output_token_ids),
            cumulative_logprob=s.cumulative_logprob if tracked else None,
            logprobs=None if s.text is None else s.text.logprobs,
            finish_reason="stop" if s in stopped else s.finish_reason,
            stop_reason=stopped.get(s, s.stop_reason),
        )
        for i, s in enumerate(seqs)
    ]


def _update_text(seq: Sequence, text: TextState, params: SamplingParams) -> str | None:
    """Appends the text of the tokens appended since the last call; returns the stop string
    it completed, if any."""
    new = seq.output_token_ids[text.num_tokens:]
    detokenizer = text.detokenizer
    if not new or detokenizer is None:  # no tokenizer: no text to update
        return None
    text.num_tokens = len(seq.output_token_ids)
    ended = seq.is_finished()
    delta = detokenizer.add_tokens(new)
    if ended:
        delta += detokenizer.flush()
    if len(seq.output_token_ids) < params.min_tokens or not params.stop:
        # Stop strings count only from min_tokens on; before that text passes through.
        text.text += delta
        return None
    emit, matched = text.stop_checker.feed(delta)
    text.text += emit
    if matched is None and ended:
        text.text += text.stop_checker.flush()
    return matched
