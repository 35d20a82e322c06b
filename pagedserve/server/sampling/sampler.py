"""The sampler: one call per engine step turns the logits of every sampling sequence into
next tokens, each row under its own request's parameters.

Processing order: penalties and biases (every row) → the structured-output grammar's mask
(rows with a grammar; the others share the step untouched) → greedy rows take the argmax →
temperature → top-k → top-p → min-p → a random draw by the exponential race. Greedy rows
(temperature 0, and beam search, which ranks candidates itself) break ties towards the lower
token id.

Logprobs in the output are the log-softmax of the RAW logits the model produced, before any
of the processing above, which is what OpenAI and vLLM report. Beam search needs the
distribution it actually ranks by, which ``compute_logprobs`` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.server.sampling.exponential_race import exponential_noise, exponential_race
from pagedserve.server.sampling.grammar import apply_grammar_bitmask
from pagedserve.server.sampling.logprobs import sampled_logprobs, sampled_ranks, top_logprobs
from pagedserve.server.sampling.metadata import SamplingMetadata
from pagedserve.server.sampling.penalties import apply_penalties_and_biases
from pagedserve.server.sampling.warpers import TopKTopP, apply_warpers


@dataclass(slots=True)
class SamplerOutput:
    """What one step sampled, row for row with the metadata's rows.

    ``top_logprobs`` holds ``k = max requested logprobs`` entries for every row (best first;
    a row that asked for fewer takes a prefix), ``None`` when no row asked for any.
    """

    sampled_token_ids: torch.Tensor  # long [N]
    # float32 [N], raw-logit logprob of the sampled token; NaN for rows that did not need it
    # (metadata.logprob_rows)
    sampled_logprobs: torch.Tensor
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # (ids long [N, k], float32 [N, k])
    sampled_ranks: torch.Tensor | None = None  # long [N], when some row asked for logprobs


class Sampler:
    """Samples a batch whose rows carry different parameters, without a loop over rows
    (except to seed the generators of seeded rows).

    ``seed`` seeds the generator that unseeded rows share; ``None`` seeds it from the OS.
    ``cpu_race`` (the kernel backend's ``exponential_race``, when it has one) draws the
    unseeded rows of a CPU batch in one pass, from one word of that generator per step;
    seeded rows keep their own generators either way. ``cpu_argmax`` (the backend's
    ``argmax``, when it has one) picks the greedy rows' tokens of a CPU batch.
    ``top_k_top_p`` (the backend's, when it has one) truncates rows without a sort.
    """

    def __init__(self, seed: int | None = None,
                 cpu_race: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
                 cpu_argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 top_k_top_p: TopKTopP | None = None) -> None:
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._cpu_race = cpu_race
        self._cpu_argmax = cpu_argmax
        self._top_k_top_p = top_k_top_p

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of ``logits`` (float32 ``[N, V]``), left unmodified unless
        no row asks for logprobs: then the grammar mask, if any, is written into it, which
        spares a copy of the whole batch's logits each step."""
        logits = _checked(logits, metadata)
        token_ids = self._sample(_processed(logits, metadata, in_place=not _wants_raw(metadata)),
                                 metadata)
        return SamplerOutput(
            sampled_token_ids=token_ids,
            sampled_logprobs=_needed_logprobs(logits, token_ids, metadata.logprob_rows),
            top_logprobs=top_logprobs(logits, metadata.max_num_logprobs),
            sampled_ranks=sampled_ranks(logits, token_ids) if metadata.wants_logprobs else None,
        )

    def process_logits(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The logits each row samples from: greedy rows after penalties and biases, random
        rows after the warpers too; masked tokens are -inf. May return ``logits`` itself."""
        logits = _checked(logits, metadata)
        processed = _processed(logits, metadata)
        if metadata.all_greedy:
            return processed
        return apply_warpers(processed, metadata, self._top_k_top_p)

    def compute_logprobs(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """float32 ``[N, V]``: log-softmax of the processed logits (what beam search ranks)."""
        return torch.log_softmax(self.process_logits(logits, metadata), dim=-1)

    def _sample(self, processed: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        if metadata.all_greedy:
            return self._argmax(processed)
        probs = apply_warpers(processed, metadata, self._top_k_top_p).softmax(dim=-1)
        shared = self._generator(processed.device) if metadata.has_unseeded_random else None
        if shared is not None and self._cpu_race is not None and probs.device.type == "cpu":
            token_ids = self._race_on_cpu(probs, metadata, shared)
        else:
            noise = exponential_noise(tuple(probs.shape), probs.device, metadata.seeded_rows,
                                      shared)
            token_ids = exponential_race(probs, noise)
        if metadata.greedy_mask is not None:
            token_ids = torch.where(metadata.greedy_mask, self._argmax(processed), token_ids)
        return token_ids

    def _argmax(self, processed: torch.Tensor) -> torch.Tensor:
        if self._cpu_argmax is not None and processed.device.type == "cpu":
            return self._cpu_argmax(processed)
        return processed.argmax(dim=-1)

    def _race_on_cpu(self, probs: torch.Tensor, metadata: SamplingMetadata,
                     shared: torch.Generator) -> torch.Tensor:
        seed = int(torch.randint(0, 1 << 62, (1,), generator=shared))
        token_ids = self._cpu_race(probs, seed)
        for row, row_seed in metadata.seeded_rows:  # the same draw as on the torch path
            noise = exponential_noise((1, probs.shape[1]), probs.device, [(0, row_seed)], None)
            token_ids[row] = exponential_race(probs[row : row + 1], noise)[0]
        return token_ids

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator


def _wants_raw(metadata: SamplingMetadata) -> bool:
    """Whether the raw logits serve the output after sampling (logprobs, ranks)."""
    return metadata.wants_logprobs or metadata.logprob_rows is None or bool(
        metadata.logprob_rows)


def _processed(logits: torch.Tensor, metadata: SamplingMetadata,
               in_place: bool = False) -> torch.Tensor:
    processed = apply_penalties_and_biases(logits, metadata)
    if metadata.grammar_bitmask is not None:
        if processed is logits and not in_place:  # the raw logits still serve the logprobs
            processed = logits.clone()
        apply_grammar_bitmask(processed, *metadata.grammar_bitmask)
    return processed


def _needed_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                     rows: list[int] | None) -> torch.Tensor:
    if rows is None:
        return sampled_logprobs(logits, token_ids)
    out = torch.full(token_ids.shape, float("nan"), dtype=torch.float32, device=logits.device)
    if rows:
        index = torch.tensor(rows, device=logits.device)
        out[index] = sampled_logprobs(logits.index_select(0, index), token_ids[index])
    return out


def _checked(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    expected = (metadata.num_rows, metadata.vocab_size)
    if logits.dim() != 2 or tuple(logits.shape) != expected:
        raise ValueError(
            f"logits of shape {tuple(logits.shape)} do not match the sampling metadata, "
            f"which expects {expected}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    # Half-precision logits lose the small differences that penalties and top-p act on.
    return logits.float()
