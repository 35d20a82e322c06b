"""The output side's record of one sequence: its text so far and its per-token logprobs.

A ``Sequence`` carries one in ``seq.text``; the scheduler only copies it when it forks the
sequence, and the output processor alone writes it. ``num_tokens`` counts the output tokens
already turned into text, so the tokens appended since are the ones to detokenize next.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.server.engine.core.outputs import PositionLogprobs
from pagedserve.server.sampling.stop_conditions import StopChecker
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass(slots=True)
class TextState:
    detokenizer: IncrementalDetokenizer | None
    stop_checker: StopChecker
    logprobs: list[PositionLogprobs] | None
    text: str = ""
    num_tokens: int = 0

    def fork(self) -> TextState:
        """An independent copy in the same state, for a sequence forked from this one."""
        return TextState(
            detokenizer=None if self.detokenizer is None else self.detokenizer.fork(),
            stop_checker=self.stop_checker.fork(),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            text=self.text,
            num_tokens=self.num_tokens,
        )
