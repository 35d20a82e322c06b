"""What one scheduling step hands to the model runner, and what applying its sampled tokens
changed (``StepUpdate``, for the output processor)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.server.engine.core.beam_search import BeamCandidates
from pagedserve.server.engine.core.outputs import PositionLogprobs
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup

BlockMapping = list[tuple[int, int]]


@dataclass(slots=True)
class ScheduledSequence:
    """One sequence in the step: compute its tokens ``[num_computed_tokens, seq_len)``.

    ``num_computed_tokens`` and ``num_tokens`` are taken when the step is scheduled, so the
    properties (and the inputs packed from them) stay valid after ``update_from_output``
    advances the sequence and appends its sampled token.
    """

    seq: Sequence
    seq_group: SequenceGroup
    num_new_tokens: int
    num_computed_tokens: int
    num_tokens: int

    @classmethod
    def of(cls, seq: Sequence, seq_group: SequenceGroup, num_new_tokens: int
           ) -> ScheduledSequence:
        return cls(seq, seq_group, num_new_tokens, seq.num_computed_tokens, seq.num_tokens)

    @property
    def samples(self) -> bool:
        """Whether this step computes the sequence's last token, so a token is sampled."""
        return self.num_computed_tokens + self.num_new_tokens == self.num_tokens

    @property
    def seq_len(self) -> int:
        """Tokens in the KV cache once the step is done (the kernels' ``seq_lens``)."""
        return self.num_computed_tokens + self.num_new_tokens

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens this step computes (recomputed ones after a preemption included)."""
        num_prompt = len(self.seq.prompt_token_ids)
        return max(0, min(self.seq_len, num_prompt) - self.num_computed_tokens)


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch and the block operations the runner does before the model runs.

    The runner must apply the block operations in this order: ``blocks_to_swap_out``
    (device → CPU), then ``blocks_to_swap_in`` (CPU → device), then ``blocks_to_copy``
    (device → device, copy-on-write and forks); a device block freed by a swap-out may be
    the destination of a later operation in the same step. ``ignored_seq_groups`` finished
    without running (they outgrew the device pool) and need an output from the engine.
    ``finished_request_ids`` lists every request that left the scheduler since the previous
    step (finished, aborted or ignored), each exactly once, so the runner can drop its state.
    """

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    blocks_to_swap_in: BlockMapping = field(default_factory=list)
    blocks_to_swap_out: BlockMapping = field(default_factory=list)
    blocks_to_copy: BlockMapping = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    ignored_seq_groups: list[SequenceGroup] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(item.num_prompt_tokens for item in self.scheduled)

    @property
    def scheduled_seq_groups(self) -> list[SequenceGroup]:
        """The groups with a sequence in the step, in batch order, each once."""
        groups: dict[str, SequenceGroup] = {}
        for item in self.scheduled:
            groups.setdefault(item.seq_group.request_id, item.seq_group)
        return list(groups.values())

    @property
    def has_block_ops(self) -> bool:
        return bool(self.blocks_to_swap_in or self.blocks_to_swap_out or self.blocks_to_copy)

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner: no sequence to compute and no block to move or copy."""
        return not self.scheduled and not self.has_block_ops


@dataclass(slots=True)
class StepUpdate:
    """What ``Scheduler.update_from_output`` changed: the requests with new tokens (or that
    finished without running), in order and each once, and the logprobs each new token
    reports (``logprobs[i]`` belongs to ``logprob_seqs[i]``'s newest tokens, in order)."""

    groups: dict[str, SequenceGroup] = field(default_factory=dict)
    logprob_seqs: list[Sequence] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)

    def touch(self, group: SequenceGroup) -> None:
        self.groups.setdefault(group.request_id, group)


@dataclass(slots=True)
class Draw:
    """One sampler row: the sequence it extends and the sample index it stands for."""

    seq: Sequence
    group: SequenceGroup
    index: int
    forks: bool  # a new sample forked from ``seq`` rather than ``seq`` itself


@dataclass(slots=True)
class SampledToken:
    """A token chosen for ``draw``: its raw logprob and the logprobs the request reports."""

    draw: Draw
    token_id: int
    logprob: float
    position: PositionLogprobs | None


@dataclass(slots=True)
class BeamStep:
    """One beam search request's beams this step and their best continuations."""

    group: SequenceGroup
    beams: list[Sequence]
    candidates: BeamCandidates


@dataclass(slots=True)
class SampledBatch:
    """What the sampler chose in one step, for ``Scheduler.update_from_output``."""

    tokens: list[SampledToken] = field(default_factory=list)
    beams: list[BeamStep] = field(default_factory=list)
    prompt_positions: list[tuple[SequenceGroup, list[PositionLogprobs]]] = field(
        default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens) + sum(len(b.beams) for b in self.beams)
