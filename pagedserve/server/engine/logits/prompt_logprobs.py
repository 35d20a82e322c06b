"""Logprobs of the prompt's own tokens (``prompt_logprobs``), as vLLM reports them.

Position 0 has none (nothing predicts the first token); position p holds the model's
logprob of prompt token p given tokens < p, its rank, and the top-k alternatives. They come
from the logits of the prompt rows computed in each prefill chunk. A request asking for them
never takes prefix-cache hits (the engine salts its block hashes), so every prompt position
is computed and none is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.server.engine.core.outputs import Logprob, PositionLogprobs
from pagedserve.server.engine.core.scheduler_output import ScheduledSequence
from pagedserve.server.engine.core.sequence import SequenceGroup


@dataclass(slots=True)
class PromptChunk:
    """Rows of one step's hidden states whose logits predict prompt tokens."""

    group: SequenceGroup
    rows: list[int]
    targets: list[int]  # the prompt token each row predicts

    @classmethod
    def of(cls, group: SequenceGroup, item: ScheduledSequence, row_start: int
           ) -> PromptChunk | None:
        prompt = item.seq.prompt_token_ids
        done = len(group.prompt_logprobs or ())  # positions already reported (None at 0)
        start, end = item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens
        # Row for position p predicts token p + 1; report positions done..len(prompt)-1.
        positions = range(max(start, done - 1), min(end, len(prompt) - 1))
        if not positions:
            return None
        return cls(group, [row_start + p - start for p in positions],
                   [prompt[p + 1] for p in positions])


def prompt_logprobs(chunks: list[PromptChunk], logits: torch.Tensor
                    ) -> list[tuple[SequenceGroup, list[PositionLogprobs]]]:
    """Each chunk's request and the logprobs of its positions, in order; ``logits`` holds the
    chunks' rows in order."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor([t for c in chunks for t in c.targets], device=logits.device)
    chosen = logprobs.gather(1, targets[:, None])
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    chosen = chosen.squeeze(1).tolist()
    k = max(c.group.sampling_params.prompt_logprobs or 0 for c in chunks)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
    row = 0
    result = []
    for chunk in chunks:
        want = chunk.group.sampling_params.prompt_logprobs
        positions = []
        for target in chunk.targets:
            position: PositionLogprobs = {target: Logprob(chosen[row], ranks[row])}
            if want and top_ids is not None and top_values is not None:
                ids = top_ids[row, :want].tolist()
                values = top_values[row, :want].tolist()
                for rank, (tid, value) in enumerate(zip(ids, values), start=1):
                    position.setdefault(tid, Logprob(value, rank))
            positions.append(position)
            row += 1
        result.append((chunk.group, positions))
    return result
