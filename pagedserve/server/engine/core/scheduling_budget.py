"""The tokens of one scheduling step, and how a request's sequences share them."""

from __future__ import annotations

from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


class SchedulingBudget:
    """Tokens left to schedule in this step (``max_num_batched_tokens`` at its start)."""

    __slots__ = ("tokens_left",)

    def __init__(self, max_num_batched_tokens: int) -> None:
        self.tokens_left = max_num_batched_tokens

    def plan(self, seq_group: SequenceGroup) -> list[tuple[Sequence, int]] | None:
        """Tokens for each running sequence of the group with work left, or None if they do
        not all get at least one: a request's sequences always advance together, so its
        samples or beams sample in the same step. Long prompts get a chunk of what is left.
        """
        seqs = [seq for seq in seq_group.get_seqs(SequenceStatus.RUNNING)
                if seq.num_uncomputed_tokens > 0]
        if self.tokens_left < len(seqs):
            return None
        left = self.tokens_left
        plan = []
        for index, seq in enumerate(seqs):
            reserved_for_rest = len(seqs) - index - 1
            num_new = min(seq.num_uncomputed_tokens, left - reserved_for_rest)
            plan.append((seq, num_new))
            left -= num_new
        return plan

    def spend(self, num_tokens: int) -> None:
        self.tokens_left -= num_tokens
