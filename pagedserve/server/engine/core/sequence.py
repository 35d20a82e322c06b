"""Sequences (one stream of tokens with its block table) and sequence groups (one request)."""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pagedserve.common.block_hash import BlockHash
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.outputs import PositionLogprobs, RequestMetrics

if TYPE_CHECKING:
    from pagedserve.server.engine.core.beam_search import BeamState
    from pagedserve.server.engine.core.text_state import TextState
    from pagedserve.server.sampling.grammar import GrammarState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    # Could never fit the device pool (it outgrew it while preempted); reported as "length".
    FINISHED_IGNORED = "finished_ignored"
    # Post-processing this request raised: it ends alone, the engine goes on.
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` of a finished status, None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "length",
    SequenceStatus.FINISHED_ERROR: "error",
}


class Sequence:
    """One stream of tokens: the prompt, the tokens generated so far, and where their KV lives.

    ``block_table[i]`` is the physical block holding tokens ``i*block_size`` to
    ``(i+1)*block_size - 1``; which pool (device or CPU swap) depends on ``status``.
    ``num_computed_tokens`` tokens have their KV in the cache; the scheduler brings it up to
    ``num_tokens`` over one or more steps. ``block_hashes`` holds the prefix-cache hash of each
    full block of ``token_ids`` (filled only when prefix caching is on).

    ``sample_index`` is the sample's place among the request's ``best_of`` samples (its seed
    offset and output index). ``text`` is the output side's record of the sequence's text
    (detokenizer, stop strings, per-token logprobs); only the output processor writes it, and
    a fork copies it. ``grammar`` is the sequence's place in its structured-output grammar
    (``None`` for free text): it follows the output tokens alone, so it survives preemption
    by recompute or swap as it is, and a fork copies it.
    """

    __slots__ = (
        "block_hashes", "block_size", "block_table", "cumulative_logprob", "finish_reason",
        "grammar",
        "num_cached_tokens", "num_computed_tokens", "num_registered_blocks",
        "output_token_ids", "prompt_token_ids", "sample_index", "seq_id", "status",
        "stop_reason", "text", "token_ids",
    )

    def __init__(self, seq_id: int, prompt_token_ids: Iterable[int], block_size: int,
                 text: TextState | None = None, grammar: GrammarState | None = None) -> None:
        self.seq_id = seq_id
        self.sample_index = 0
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(self.prompt_token_ids)
        self.block_size = block_size
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[BlockHash] = []
        # How many leading blocks of block_table were offered to the prefix cache.
        self.num_registered_blocks = 0
        self.cumulative_logprob = 0.0
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.text = text
        self.grammar = grammar

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
                f"num_tokens={self.num_tokens}, num_computed_tokens={self.num_computed_tokens}, "
                f"block_table={self.block_table})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token(self, token_id: int, logprob: float) -> None:
        """Append a sampled token and add its logprob to the running sum."""
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob

    def fork(self, new_seq_id: int, sample_index: int | None = None) -> Sequence:
        """A copy under a new id with the same block table; the caller fixes ref counts."""
        child = copy.copy(self)
        child.seq_id = new_seq_id
        if sample_index is not None:
            child.sample_index = sample_index
        child.text = None if self.text is None else self.text.fork()
        child.grammar = None if self.grammar is None else self.grammar.fork()
        child.prompt_token_ids = self.prompt_token_ids  # never mutated: safe to share
        child.output_token_ids = list(self.output_token_ids)
        child.token_ids = list(self.token_ids)
        child.block_table = list(self.block_table)
        child.block_hashes = list(self.block_hashes)
        return child

    def reset_for_recompute(self) -> None:
        """Forget all KV (its blocks were freed); the tokens are prefilled again from 0."""
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table = []
        self.num_registered_blocks = 0
        self.status = SequenceStatus.WAITING


class SequenceGroup:
    """One request: its sampling parameters and its samples or beams, sharing one prompt.

    A request starts with one sequence; parallel sampling and beam search fork more after the
    prompt is computed, so their prompt blocks are shared. ``cache_salt`` separates prefix-cache
    entries of tenants that must not see each other's hits; ``tenant`` names whose request
    it is (an API key, a client), which the scheduler's admission is fair between. The group
    is the one home of the request's state: its prompt text, its stop token, its beam search,
    its prompt logprobs and its timing record (``metrics``); the scheduler changes them.
    """

    __slots__ = ("bad_words_token_ids", "beam", "cache_salt", "eos_token_id", "metrics",
                 "prompt", "prompt_logprobs", "request_id", "sampling_params", "seqs", "tenant")

    def __init__(
        self,
        request_id: str,
        seqs: Iterable[Sequence],
        sampling_params: SamplingParams,
        arrival_time: float,
        cache_salt: str | None = None,
        *,
        prompt: str | None = None,
        eos_token_id: int | None = None,
        bad_words_token_ids: list[list[int]] | None = None,
        beam: BeamState | None = None,
        tenant: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.tenant = tenant
        self.seqs: list[Sequence] = list(seqs)
        if not self.seqs:
            raise ValueError(f"request {request_id!r} needs at least one sequence")
        self.sampling_params = sampling_params
        self.cache_salt = cache_salt
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.prompt = prompt
        self.eos_token_id = eos_token_id
        self.bad_words_token_ids = bad_words_token_ids or []
        self.beam = beam
        # Position 0 has no logprob: nothing predicts the first token.
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            None if sampling_params.prompt_logprobs is None else [None])

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id!r}, seqs={self.seqs})"

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.seqs[0].prompt_token_ids

    @property
    def arrival_time(self) -> float:
        return self.metrics.arrival_time

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        if status is None:
            return list(self.seqs)
        return [seq for seq in self.seqs if seq.status is status]

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [seq for seq in self.seqs if not seq.status.is_finished]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))

    def num_unfinished_seqs(self) -> int:
        return len(self.get_unfinished_seqs())

    def is_finished(self) -> bool:
        return all(seq.status.is_finished for seq in self.seqs)

    def find(self, seq_id: int) -> Sequence:
        for seq in self.seqs:
            if seq.seq_id == seq_id:
                return seq
        raise KeyError(f"request {self.request_id!r} has no sequence {seq_id}")

    def add(self, seq: Sequence) -> None:
        if any(other.seq_id == seq.seq_id for other in self.seqs):
            raise ValueError(f"request {self.request_id!r} already has sequence {seq.seq_id}")
        self.seqs.append(seq)

    def remove(self, seq_id: int) -> None:
        self.seqs.remove(self.find(seq_id))

    def max_num_running_seqs(self) -> int:
        """Sequences this request may run at once: forks still to come count already. A
        ``best_of > 1`` request forks when it samples its first token, so its forks are to
        come exactly while it has none (counting ``best_of > len(seqs)`` instead would count
        them again once a forked sequence is dropped)."""
        params = self.sampling_params
        forks_to_come = params.num_samples > 1 and self.seqs[0].num_output_tokens == 0
        width = params.num_samples if params.use_beam_search or forks_to_come else 1
        return max(width, self.num_unfinished_seqs())
