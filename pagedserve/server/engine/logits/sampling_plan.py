"""Choosing one step's tokens: which hidden-state rows to turn into logits, then the sampler.

``SamplingPlan.of`` lists the rows: one per sampling sequence, except that a request with
``best_of > 1`` samples its prompt row ``best_of`` times on its first token (sample i seeded
with ``seed + i``), each draw after the first becoming a fork; then the beams of each beam
search request; then the prompt positions whose logprobs were asked for. ``TokenSampler``
samples them and returns a ``SampledBatch``: plain data that the scheduler applies (append,
fork, finish) in ``update_from_output``. Nothing here changes a sequence or a request.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.outputs import Logprob, PositionLogprobs
from pagedserve.server.engine.core.scheduler_output import (
    BeamStep,
    Draw,
    SampledBatch,
    SampledToken,
    SchedulerOutput,
)
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.logits.prompt_logprobs import PromptChunk, prompt_logprobs
from pagedserve.server.sampling.metadata import SamplingMetadata
from pagedserve.server.sampling.sampler import Sampler, SamplerOutput
from pagedserve.server.sampling.sampling_row import SamplingRow


@dataclass(slots=True)
class SamplingPlan:
    """Logits rows in order: draws, then beams grouped by request, then prompt positions."""

    rows: list[int] = field(default_factory=list)  # hidden-state row of each draw
    draws: list[Draw] = field(default_factory=list)
    beams: dict[str, tuple[SequenceGroup, list[tuple[Sequence, int]]]] = field(
        default_factory=dict)
    prompt_chunks: list[PromptChunk] = field(default_factory=list)

    @classmethod
    def of(cls, out: SchedulerOutput, starts: list[int] | None = None) -> SamplingPlan:
        """``starts[i]`` is the first hidden-state row of ``out.scheduled[i]`` (by default
        the packing's: each sequence's new tokens back to back)."""
        if starts is None:
            starts = list(itertools.accumulate(
                (item.num_new_tokens for item in out.scheduled), initial=0))
        plan = cls()
        for i, item in enumerate(out.scheduled):
            group = item.seq_group
            if group.prompt_logprobs is not None:
                chunk = PromptChunk.of(group, item, starts[i])
                if chunk is not None:
                    plan.prompt_chunks.append(chunk)
            if item.samples:
                plan._add_row(group, item.seq, starts[i + 1] - 1)
        return plan

    def _add_row(self, group: SequenceGroup, seq: Sequence, row: int) -> None:
        if group.beam is not None:
            self.beams.setdefault(group.request_id, (group, []))[1].append((seq, row))
            return
        first = not seq.output_token_ids and len(group.seqs) == 1
        for k in range(group.sampling_params.num_samples if first else 1):
            self.rows.append(row)
            self.draws.append(Draw(seq, group, k if first else seq.sample_index, forks=k > 0))

    def logit_rows(self) -> list[int]:
        """The rows whose logits the runner computes, in the order ``TokenSampler.sample``
        reads them; a row sampled ``best_of`` times appears that many times."""
        rows = list(self.rows)
        rows.extend(row for _, beams in self.beams.values() for _, row in beams)
        for chunk in self.prompt_chunks:
            rows.extend(chunk.rows)
        return rows


class TokenSampler:
    """Turns a plan's logits into a ``SampledBatch`` with the engine's one ``Sampler``."""

    def __init__(self, sampler: Sampler, vocab_size: int) -> None:
        self.sampler = sampler
        self.vocab_size = vocab_size

    def sample(self, plan: SamplingPlan, logits: torch.Tensor | None) -> SampledBatch:
        batch = SampledBatch()
        if logits is None:
            return batch
        n_draws = len(plan.draws)
        n_beams = sum(len(beams) for _, beams in plan.beams.values())
        if n_draws:
            batch.tokens = self._draw(plan.draws, logits[:n_draws])
        if n_beams:
            batch.beams = self._beams(plan, logits[n_draws:n_draws + n_beams])
        if plan.prompt_chunks:
            batch.prompt_positions = prompt_logprobs(plan.prompt_chunks,
                                                    logits[n_draws + n_beams:])
        return batch

    def _metadata(self, seqs: list[Sequence], groups: list[SequenceGroup],
                  seeds: list[int | None], device: torch.device) -> SamplingMetadata:
        rows = [SamplingRow(params=g.sampling_params, prompt_token_ids=s.prompt_token_ids,
                            output_token_ids=s.output_token_ids, seed=seed,
                            eos_token_id=g.eos_token_id,
                            bad_words_token_ids=g.bad_words_token_ids, grammar=s.grammar)
                for s, g, seed in zip(seqs, groups, seeds)]
        # The engine checked each request's ids when it arrived (LLMEngine.prepare_request).
        return SamplingMetadata.build(rows, self.vocab_size, device, check_rows=False)

    def _draw(self, draws: list[Draw], logits: torch.Tensor) -> list[SampledToken]:
        params = [d.group.sampling_params for d in draws]
        seeds = [None if p.seed is None else p.seed + d.index for p, d in zip(params, draws)]
        metadata = self._metadata([d.seq for d in draws], [d.group for d in draws], seeds,
                                  logits.device)
        result = self.sampler(logits, metadata)
        tokens = result.sampled_token_ids.tolist()
        logprobs = result.sampled_logprobs.tolist()
        positions = _position_logprobs(result, params)
        return [SampledToken(d, tokens[i], logprobs[i], positions[i])
                for i, d in enumerate(draws)]

    def _beams(self, plan: SamplingPlan, logits: torch.Tensor) -> list[BeamStep]:
        groups = [group for group, beams in plan.beams.values() for _ in beams]
        seqs = [seq for _, beams in plan.beams.values() for seq, _ in beams]
        logprobs = self.sampler.compute_logprobs(
            logits, self._metadata(seqs, groups, [None] * len(seqs), logits.device))
        steps, offset = [], 0
        for group, beam_rows in plan.beams.values():
            beams = [seq for seq, _ in beam_rows]
            scores = [b.cumulative_logprob for b in beams]
            beam = group.beam
            assert beam is not None, "a beam row's request runs beam search"
            candidates = beam.candidates(scores, logprobs[offset:offset + len(beams)])
            steps.append(BeamStep(group, beams, candidates))
            offset += len(beams)
        return steps


def _position_logprobs(result: SamplerOutput, params: list[SamplingParams]
                       ) -> list[PositionLogprobs | None]:
    """Per row: the sampled token's logprob and rank plus the top-k the request asked for."""
    if result.sampled_ranks is None:
        return [None] * len(params)
    tokens = result.sampled_token_ids.tolist()
    logprobs = result.sampled_logprobs.tolist()
    ranks = result.sampled_ranks.tolist()
    top_ids, top_values = ([], []) if result.top_logprobs is None else (
        result.top_logprobs[0].tolist(), result.top_logprobs[1].tolist())
    positions: list[PositionLogprobs | None] = []
    for i, p in enumerate(params):
        if p.logprobs is None:
            positions.append(None)
            continue
        position = {tokens[i]: Logprob(logprobs[i], ranks[i])}
        if p.logprobs:
            for rank, (tid, value) in enumerate(zip(top_ids[i][:p.logprobs],
                                                    top_values[i][:p.logprobs]), start=1):
                position.setdefault(tid, Logprob(value, rank))
        positions.append(position)
    return positions
