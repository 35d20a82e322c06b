"""The tokens of one scheduling step, and how a request's sequences share them."""

from __future__ import annotations

from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.engine.core.step_shares import StepShares, is_prefilling


class SchedulingBudget:
    """Tokens left to schedule in this step (``max_num_batched_tokens`` at its start), and,
    while several tenants have requests live, each tenant's prefill allowance (``shares``)."""

    __slots__ = ("shares", "tokens_left")

    def __init__(self, max_num_batched_tokens: int, shares: StepShares | None = None) -> None:
        self.tokens_left = max_num_batched_tokens
        self.shares = shares

    def plan(self, seq_group: SequenceGroup) -> list[tuple[Sequence, int]] | None:
        """Tokens for each running sequence of the group with work left, or None if they do
        not all get at least one: a request's sequences always advance together, so its
        samples or beams sample in the same step. Long prompts get a chunk of what is left.
        A prefill whose tenant has spent its allowance gets an empty plan (it waits for the
        next step while the others go on).
        """
        seqs = [seq for seq in seq_group.get_seqs(SequenceStatus.RUNNING)
                if seq.num_uncomputed_tokens > 0]
        if self.tokens_left < len(seqs):
            return None
        left = self.tokens_left
        shares = self._shares_of(seq_group)
        if shares is not None:
            left = min(left, shares.left(seq_group.tenant))
            if left < len(seqs):
                return []
        plan = []
        for index, seq in enumerate(seqs):
            reserved_for_rest = len(seqs) - index - 1
            num_new = min(seq.num_uncomputed_tokens, left - reserved_for_rest)
            plan.append((seq, num_new))
            left -= num_new
        return plan

    def admits(self, seq_group: SequenceGroup) -> bool:
        """Whether a waiting request would get a token for each of its sequences."""
        width = seq_group.num_seqs(SequenceStatus.WAITING)
        shares = self._shares_of(seq_group)
        if shares is not None and shares.left(seq_group.tenant) < width:
            return False
        return self.tokens_left >= width

    def spend(self, seq_group: SequenceGroup, num_tokens: int) -> None:
        shares = self._shares_of(seq_group)
        if shares is not None:
            shares.spend(seq_group.tenant, num_tokens)
        self.tokens_left -= num_tokens

    def _shares_of(self, seq_group: SequenceGroup) -> StepShares | None:
        """The allowances that bound this request: a prefill's, while tenants share."""
        return self.shares if is_prefilling(seq_group) else None
