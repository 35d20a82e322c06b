"""When a sequence stops: the token rule (EOS, ``stop_token_ids``, ``max_tokens``) and stop
strings matched on the detokenized text as it streams.

A stop string can straddle deltas (and tokens), so ``StopChecker`` holds back the longest tail
of the text that could still begin one — at most ``max(len(stop)) - 1`` characters — and emits
the rest. Text once emitted is never cut later, so a streamed response and the final text
agree.

When several stop strings occur, the one that completes first wins (the one a character-by-
character stream would meet first); of those completing at the same character, the longest. The
output is cut where the winner begins, or where it ends with ``include_stop_str_in_output``.
The result does not depend on how the text is split into deltas.

Typical use per sequence::

    emit, matched = checker.feed(detokenizer.add_tokens(new_ids))
    ...  # on EOS or max_tokens: feed(detokenizer.flush()), then flush() the checker
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]


def check_stop_token(
    params: SamplingParams,
    output_len: int,
    token_id: int,
    eos_token_id: int | None,
) -> tuple[FinishReason | None, int | None]:
    """Decide whether the token just appended ends the sequence.

    ``output_len`` counts the generated tokens including ``token_id``. Returns
    ``(finish_reason, stop_reason)``: ``("stop", None)`` for EOS, ``("stop", token_id)`` for a
    member of ``stop_token_ids``, ``("length", None)`` at ``max_tokens``, ``(None, None)`` to
    continue. Nothing stops before ``min_tokens`` tokens exist.
    """
    if output_len < params.min_tokens:
        return None, None
    # A stop token in the last allowed position reports "stop", as OpenAI and vLLM do: the
    # model chose to end there, the cap did not cut it off.
    if not params.ignore_eos and eos_token_id is not None and token_id == eos_token_id:
        return "stop", None
    if token_id in params.stop_token_ids:
        return "stop", token_id
    if params.max_tokens is not None and output_len >= params.max_tokens:
        return "length", None
    return None, None


class StopChecker:
    """Finds the first stop string in a stream of text deltas."""

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        for i, text in enumerate(stop):
            if not isinstance(text, str) or not text:
                raise InvalidRequestError(f"stop[{i}] must be a non-empty string, got {text!r}",
                                          param="stop")
        self._stop = tuple(dict.fromkeys(stop))
        self._include = include_stop_str_in_output
        self._max_partial = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, str | None]:
        """(text safe to emit now, the stop string matched or None).

        After a match the sequence is over; feeding more raises RuntimeError.
        """
        if self.matched is not None:
            raise RuntimeError(f"stop string {self.matched!r} already ended this sequence")
        text = self._pending + delta
        hit = self._first_match(text)
        if hit is not None:
            start, stop = hit
            self.matched, self._pending = stop, ""
            return text[: start + len(stop) if self._include else start], stop
        keep = self._partial_tail(text)
        self._pending = text[len(text) - keep:]
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """The held-back text, for a sequence that ended another way (EOS, length)."""
        text, self._pending = self._pending, ""
        return text

    def fork(self) -> StopChecker:
        """An independent copy in the same state, for a sequence forked from this one."""
        child = StopChecker(self._stop, self._include)
        child._pending, child.matched = self._pending, self.matched
        return child

    def _first_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self._stop:
            start = text.find(stop)
            if start >= 0:
                candidate = (start + len(stop), -len(stop), stop)
                best = candidate if best is None else min(best, candidate)
        return None if best is None else (best[0] + best[1], best[2])

    def _partial_tail(self, text: str) -> int:
        # The text holds no whole stop string here, so a tail that begins one is a proper
        # prefix of it and shorter than the longest stop string.
        for length in range(min(len(text), self._max_partial), 0, -1):
            tail = text[-length:]
            if any(stop.startswith(tail) for stop in self._stop):
                return length
        return 0
