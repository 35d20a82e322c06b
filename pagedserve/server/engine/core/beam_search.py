"""Beam search inside the engine, with transformers' ranking rules.

Each step the live beams of a request are extended together: the top ``2 × width``
(beam, token) continuations by cumulative log probability are ranked; continuations that end
(EOS, max_tokens, max_model_len) and rank within the first ``width`` become finished
hypotheses scored ``cumulative_logprob / generated_len ** length_penalty``; the best ``width``
continuations that do not end become the next live beams. A beam that no continuation keeps
is freed; a beam kept more than once is forked, so beams share their blocks through ref
counts and copy-on-write. The search stops when no live beam can beat the worst kept
hypothesis (transformers' default heuristic; ``early_stopping=True`` stops once ``width``
hypotheses exist), or when every continuation ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedserve.common.sampling_params import SamplingParams

_NEG_INF = -1.0e9


@dataclass(slots=True)
class BeamHypothesis:
    """A finished beam: its generated tokens, their summed logprob and its ranking score."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass(slots=True)
class BeamContinuation:
    """A live beam for the next step: ``parent`` (index into this step's beams) + ``token``."""

    parent: int
    token_id: int
    logprob: float


@dataclass(slots=True)
class BeamCandidates:
    """The top (beam, token) pairs of one step: ``indices[k] = beam * vocab_size + token``,
    ``values[k]`` their cumulative logprobs, best first."""

    values: list[float]
    indices: list[int]
    vocab_size: int


@dataclass(slots=True)
class BeamState:
    """Per-request search state kept between steps."""

    width: int
    length_penalty: float
    early_stopping: bool
    max_tokens: int
    eos_token_ids: frozenset[int]
    hypotheses: list[BeamHypothesis] = field(default_factory=list)
    can_improve: bool = True
    done: bool = False

    @classmethod
    def for_request(cls, params: SamplingParams, eos_token_id: int | None,
                    room: int) -> BeamState | None:
        """A request's search state, None unless it uses beam search. ``room``: the tokens
        the context leaves after the prompt, which bounds the beams as ``max_tokens`` does."""
        if not params.use_beam_search:
            return None
        ends = frozenset() if params.ignore_eos or eos_token_id is None \
            else frozenset([eos_token_id])
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        return cls(width=params.beam_width, length_penalty=params.length_penalty,
                   early_stopping=params.early_stopping, max_tokens=max_tokens,
                   eos_token_ids=ends)

    def candidates(self, beam_scores: list[float], logprobs: torch.Tensor) -> BeamCandidates:
        """This step's best (beam, token) continuations by cumulative logprob: enough that
        ``width`` of them can go on after the ones that end. ``beam_scores[i]`` is beam i's
        summed logprob, ``logprobs[i]`` its next-token log probabilities [vocab]."""
        scores = torch.tensor(beam_scores, dtype=torch.float32, device=logprobs.device)
        total = (logprobs.float() + scores[:, None]).flatten()
        keep = min(max(2, 1 + len(self.eos_token_ids)) * self.width, total.numel())
        values, indices = torch.topk(total, keep)
        return BeamCandidates(values.tolist(), indices.tolist(), logprobs.shape[-1])

    def step(self, beam_tokens: list[list[int]], beam_scores: list[float],
             candidates: BeamCandidates) -> list[BeamContinuation]:
        """Ranks this step's continuations; returns the next live beams (empty when done).

        ``beam_tokens[i]`` are beam i's generated tokens so far, ``beam_scores[i]`` their
        summed logprob, ``candidates`` what :meth:`candidates` found for these beams.
        """
        vocab = candidates.vocab_size
        values = candidates.values
        generated = len(beam_tokens[0]) + 1  # every live beam has the same length
        running: list[BeamContinuation] = []
        all_end = True
        ends_by_length = generated >= self.max_tokens
        for rank, (value, index) in enumerate(zip(values, candidates.indices)):
            parent, token = divmod(index, vocab)
            ends = ends_by_length or token in self.eos_token_ids
            all_end = all_end and ends
            if not ends:
                if len(running) < self.width:
                    running.append(BeamContinuation(parent, token, value - beam_scores[parent]))
            elif rank < self.width:
                reason = "stop" if token in self.eos_token_ids else "length"
                self._offer(beam_tokens[parent] + [token], value, generated, reason)
        best_running = values[0] if not running else _first_score(running, beam_scores)
        self._update_can_improve(best_running, generated)
        full = len(self.hypotheses) >= self.width
        self.done = all_end or not self.can_improve or (self.early_stopping and full)
        return [] if self.done else running

    def _offer(self, token_ids: list[int], cumulative: float, generated: int,
               reason: str) -> None:
        if not self.can_improve:
            return
        if self.early_stopping and len(self.hypotheses) >= self.width:
            return
        score = cumulative / (generated**self.length_penalty)
        self.hypotheses.append(BeamHypothesis(token_ids, cumulative, score, reason))
        self.hypotheses.sort(key=lambda h: h.score, reverse=True)
        del self.hypotheses[self.width:]

    def _update_can_improve(self, best_running: float, generated: int) -> None:
        if len(self.hypotheses) < self.width:
            return  # an empty slot can always be filled
        worst = self.hypotheses[-1].score
        self.can_improve = self.can_improve and best_running / (
            generated**self.length_penalty) > worst

    def results(self, live_tokens: list[list[int]], live_scores: list[float]
                ) -> list[BeamHypothesis]:
        """The best ``width`` hypotheses, best first; live beams fill empty slots."""
        results = list(self.hypotheses)
        for tokens, score in sorted(zip(live_tokens, live_scores), key=lambda x: -x[1]):
            if len(results) >= self.width:
                break
            n = max(1, len(tokens))
            results.append(BeamHypothesis(list(tokens), score, score / n**self.length_penalty,
                                          "length"))
        return sorted(results, key=lambda h: h.score, reverse=True)


def _first_score(running: list[BeamContinuation], beam_scores: list[float]) -> float:
    first = running[0]
    return beam_scores[first.parent] + first.logprob
