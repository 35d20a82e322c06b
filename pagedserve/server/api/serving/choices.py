"""Response shaping the routes share: each choice's progress as a stream goes on (the
deltas to send, per choice), and the usage of a response."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.server.engine.core.outputs import CompletionOutput, PositionLogprobs, RequestOutput


def new_logprobs(output: CompletionOutput, start: int) -> list[PositionLogprobs | None] | None:
    """The logprobs of tokens ``start:`` of ``output`` (the engine's list may run ahead)."""
    if output.logprobs is None:
        return None
    return list(output.logprobs[start : len(output.token_ids)])


def usage(finals: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(f.prompt_token_ids) for f in finals)
    completion = sum(len(o.token_ids) for f in finals for o in f.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice gained since it was last sent."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs | None] | None
    finish_reason: str | None
    stop_reason: int | str | None
    first: bool


@dataclass(slots=True)
class _Sent:
    text_len: int = 0
    num_tokens: int = 0
    finished: bool = False


@dataclass(slots=True)
class StreamTracker:
    """Per-choice progress of a stream; choice index = prompt index · n + output index."""

    n: int
    _sent: dict[int, _Sent] = field(default_factory=dict)
    _prompt_tokens: dict[int, int] = field(default_factory=dict)

    def deltas(self, prompt_index: int, output: RequestOutput) -> list[ChoiceDelta]:
        self._prompt_tokens[prompt_index] = len(output.prompt_token_ids)
        deltas = []
        for o in output.outputs:
            index = prompt_index * self.n + o.index
            sent = self._sent.setdefault(index, _Sent())
            grew = len(o.token_ids) > sent.num_tokens or len(o.text) > sent.text_len
            if sent.finished or not (grew or o.finished):
                continue
            deltas.append(ChoiceDelta(
                index=index,
                text=o.text[sent.text_len:],
                token_ids=o.token_ids[sent.num_tokens:],
                logprobs=new_logprobs(o, sent.num_tokens),
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                first=sent.num_tokens == 0 and sent.text_len == 0,
            ))
            sent.text_len, sent.num_tokens = len(o.text), len(o.token_ids)
            sent.finished = o.finished
        return deltas

    def usage(self) -> dict[str, int]:
        prompt = sum(self._prompt_tokens.values())
        completion = sum(s.num_tokens for s in self._sent.values())
        return _usage(prompt, completion)

    def choice_usage(self, index: int) -> dict[str, int]:
        """One choice's usage so far (vLLM's ``continuous_usage_stats``): its prompt, its
        tokens."""
        return _usage(self._prompt_tokens[index // self.n], self._sent[index].num_tokens)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}
