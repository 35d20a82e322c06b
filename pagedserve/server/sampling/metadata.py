"""Per-step sampling inputs: one ``SamplingRow`` per sampling sequence, packed into tensors.

``SamplingMetadata.build`` runs once per engine step. It turns every row's parameters into
padded ``[N]`` and ``[N, V]`` tensors so that the sampler processes the whole batch with
vectorised ops, and leaves a field ``None`` when no row needs it so that the sampler skips
that work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedserve.common.sampling_params import SamplingParams, SamplingType
from pagedserve.server.sampling.exponential_race import generator_seed
from pagedserve.server.sampling.grammar import grammar_bitmask
from pagedserve.server.sampling.sampling_row import SamplingRow
from pagedserve.server.sampling.token_masks import build_blocked_mask, build_logit_bias
from pagedserve.server.sampling.validation import validate_token_ids


@dataclass(slots=True)
class SamplingMetadata:
    """The batch's sampling parameters as tensors on the logits' device.

    ``[N]`` columns hold neutral values on rows that did not ask for the operation (and on
    greedy rows for the random-only ones), so one op serves the whole batch; a field is
    ``None`` when no row asked for it.
    """

    num_rows: int
    vocab_size: int
    device: torch.device
    all_greedy: bool
    greedy_mask: torch.Tensor | None  # bool [N]; None when no row is greedy
    temperature: torch.Tensor | None  # float32 [N]
    top_k: torch.Tensor | None  # long [N], clamped to [1, V]
    top_p: torch.Tensor | None  # float32 [N]
    min_p: torch.Tensor | None  # float32 [N]
    repetition_penalty: torch.Tensor | None  # float32 [N]
    presence_penalty: torch.Tensor | None  # float32 [N]
    frequency_penalty: torch.Tensor | None  # float32 [N]
    prompt_mask: torch.Tensor | None  # bool [N, V]: token occurs in the prompt
    output_counts: torch.Tensor | None  # int32 [N, V]: occurrences in the output
    logit_bias: torch.Tensor | None  # float32 [N, V]
    blocked_mask: torch.Tensor | None  # bool [N, V]: token may not be sampled
    # (int32 [N, ceil(V/32)] on the CPU: bit t set where token t may come next, the rows
    # with a grammar); None when no row has one
    grammar_bitmask: tuple[torch.Tensor, list[int]] | None
    seeded_rows: list[tuple[int, int]]  # (row, generator seed) of seeded random rows
    has_unseeded_random: bool
    max_num_logprobs: int
    wants_logprobs: bool  # some row asked for logprobs (0 = the sampled token's alone)
    # Rows whose sampled token's logprob is needed (logprobs asked, or best_of ranking);
    # None when every row needs it. The others skip a reduction over the vocabulary.
    logprob_rows: list[int] | None

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device | str,
        check_rows: bool = True,
    ) -> SamplingMetadata:
        """Validate the rows against the vocabulary and pack them for one step.
        ``check_rows=False`` skips the per-row id checks, for a caller that made them once
        when each request arrived (the engine does, every step would repeat them)."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
        device = torch.device(device)
        if check_rows:
            for row in rows:
                _check_row(row, vocab_size)
        greedy = [row.params.sampling_type is not SamplingType.RANDOM for row in rows]
        columns = _Columns([r.params for r in rows], greedy, vocab_size, device)
        penalties = (columns.repetition, columns.presence, columns.frequency)
        counts_needed = any(column is not None for column in penalties)
        return cls(
            num_rows=len(rows),
            vocab_size=vocab_size,
            device=device,
            all_greedy=all(greedy),
            greedy_mask=_column(greedy, torch.bool, device) if any(greedy) else None,
            temperature=columns.temperature,
            top_k=columns.top_k,
            top_p=columns.top_p,
            min_p=columns.min_p,
            repetition_penalty=columns.repetition,
            presence_penalty=columns.presence,
            frequency_penalty=columns.frequency,
            prompt_mask=(
                _token_counts([r.prompt_token_ids for r in rows], vocab_size, device) > 0
                if columns.repetition is not None
                else None
            ),
            output_counts=(
                _token_counts([r.output_token_ids for r in rows], vocab_size, device)
                if counts_needed
                else None
            ),
            logit_bias=build_logit_bias([r.params for r in rows], vocab_size, device),
            blocked_mask=build_blocked_mask(rows, vocab_size, device),
            grammar_bitmask=grammar_bitmask([r.grammar for r in rows], vocab_size),
            seeded_rows=[
                (i, generator_seed(row.seed, len(row.output_token_ids)))
                for i, row in enumerate(rows)
                if row.seed is not None and not greedy[i]
            ],
            has_unseeded_random=any(
                row.seed is None and not greedy[i] for i, row in enumerate(rows)
            ),
            max_num_logprobs=max((row.params.logprobs or 0 for row in rows), default=0),
            wants_logprobs=any(row.params.logprobs is not None for row in rows),
            logprob_rows=_logprob_rows(rows),
        )


def _logprob_rows(rows: Sequence[SamplingRow]) -> list[int] | None:
    needed = [i for i, row in enumerate(rows)
              if row.params.logprobs is not None or row.params.num_samples > row.params.n]
    return None if len(needed) == len(rows) else needed


class _Columns:
    """The ``[N]`` parameter columns, each ``None`` when every row holds the neutral value."""

    def __init__(
        self,
        params: Sequence[SamplingParams],
        greedy: Sequence[bool],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        def random_only(values: list, neutral: float, dtype: torch.dtype) -> torch.Tensor | None:
            # Greedy rows take the neutral value so that the batched warpers leave them alone.
            values = [neutral if g else v for v, g in zip(values, greedy, strict=True)]
            return _optional_column(values, neutral, dtype, device)

        def every_row(values: list, neutral: float) -> torch.Tensor | None:
            return _optional_column(values, neutral, torch.float32, device)

        self.temperature = random_only([p.temperature for p in params], 1.0, torch.float32)
        self.top_k = random_only(
            [_clamped_top_k(p.top_k, vocab_size) for p in params], vocab_size, torch.long
        )
        self.top_p = random_only([p.top_p for p in params], 1.0, torch.float32)
        self.min_p = random_only([p.min_p for p in params], 0.0, torch.float32)
        self.repetition = every_row([p.repetition_penalty for p in params], 1.0)
        self.presence = every_row([p.presence_penalty for p in params], 0.0)
        self.frequency = every_row([p.frequency_penalty for p in params], 0.0)


def _check_row(row: SamplingRow, vocab_size: int) -> None:
    if row.params.bad_words and not row.bad_words_token_ids:
        # Words are tokenized by the engine, which owns the tokenizer; without their ids the
        # ban would silently not happen.
        raise ValueError(
            f"row has bad_words {row.params.bad_words!r} but no bad_words_token_ids"
        )
    validate_token_ids(row.params, vocab_size, row.eos_token_id, row.bad_words_token_ids)


def _clamped_top_k(top_k: int, vocab_size: int) -> int:
    return vocab_size if top_k == -1 else min(top_k, vocab_size)


def _column(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _optional_column(
    values: list, neutral: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    if all(v == neutral for v in values):
        return None
    return _column(values, dtype, device)


def _token_counts(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Occurrences of each token id per row, int32 ``[N, V]``."""
    width = max((len(tokens) for tokens in token_lists), default=0)
    # Rows are padded with the id ``vocab_size``, which lands in an extra column that is cut
    # off afterwards, so ragged rows scatter in one op.
    padded = [list(tokens) + [vocab_size] * (width - len(tokens)) for tokens in token_lists]
    ids = _column(padded, torch.long, device).view(len(token_lists), width)
    counts = torch.zeros(len(token_lists), vocab_size + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab_size]
