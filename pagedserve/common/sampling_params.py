"""Per-request decoding parameters, validated on construction (vLLM's names and meanings)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError

_SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20


class SamplingType(Enum):
    GREEDY = "greedy"
    RANDOM = "random"
    BEAM = "beam"


def _check(ok: bool, param: str, value: object, limit: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param} must be {limit}, got {value!r}", param=param)


_KINDS = ("json", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """One constraint on a request's output, as vLLM names them: a JSON schema (``json``,
    an object or its text), any JSON object (``json_object``), a regular expression
    (``regex``), one of several strings (``choice``), an EBNF grammar (``grammar``) or an
    xgrammar structural tag (``structural_tag``, its JSON text: free text in which a trigger
    starts a constrained part, as a tool call does).

    ``any_whitespace`` lets JSON carry any whitespace between its tokens; off by default
    (one space after ``:`` and ``,``), since a small model that may write whitespace anywhere
    can fill its whole budget with it. ``source`` names the request field the constraint came
    from, so that an error can name it; it is not part of the constraint.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    json_object: bool = False
    any_whitespace: bool = False
    source: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [k for k in _KINDS if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise InvalidRequestError(
                f"{self.source} must set exactly one of json, regex, choice, grammar, "
                f"structural_tag and json_object, got {kinds or 'none'}", param=self.source)
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) and c for c in self.choice)):
            raise InvalidRequestError(f"{self.source} choice must be a non-empty list of "
                                      f"non-empty strings, got {list(self.choice)!r}",
                                      param=self.source)

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(k for k in _KINDS if getattr(self, k) is not None)

    def key(self) -> tuple[str, str, bool]:
        """What identifies the compiled grammar (a schema's text with sorted keys)."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, tuple):
            value = json.dumps(value)
        return self.kind, str(value), self.any_whitespace


@dataclass(slots=True)
class SamplingParams:
    """What to generate for one request.

    ``n`` outputs are returned; ``best_of`` (>= n) are generated and the n with the highest
    cumulative logprob kept. ``use_beam_search`` runs beam search of width ``best_of or n``.
    ``temperature == 0`` means greedy. ``seed`` makes random sampling reproducible
    independently of how requests are batched. ``logprobs`` asks for that many top
    logprobs per generated token (0 = only the sampled token's), ``prompt_logprobs`` the
    same for each prompt token.
    """

    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        self.logit_bias = {int(k): float(v) for k, v in (self.logit_bias or {}).items()}
        if self.best_of is None:
            self.best_of = self.n
        self._validate()

    def _validate(self) -> None:
        _check(self.n >= 1, "n", self.n, "at least 1")
        _check(self.num_samples >= self.n, "best_of", self.best_of, f"at least n ({self.n})")
        _check(self.temperature >= 0.0, "temperature", self.temperature, "non-negative")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "in (0, 1]")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "-1 (off) or at least 1")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, value, "in [-2, 2]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", self.repetition_penalty,
               "greater than 0")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens,
               "at least 1")
        _check(self.min_tokens >= 0, "min_tokens", self.min_tokens, "non-negative")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               self.min_tokens, f"at most max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or 0 <= value <= MAX_LOGPROBS, name, value,
                   f"in [0, {MAX_LOGPROBS}]")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
               "non-negative token ids")
        _check(all(s for s in self.stop), "stop", self.stop, "non-empty strings")
        _check(self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
               "allowed_token_ids", self.allowed_token_ids, "a non-empty list")
        for bias in self.logit_bias.values():
            _check(-100.0 <= bias <= 100.0, "logit_bias", bias, "in [-100, 100]")
        if self.use_beam_search and self.structured_outputs is not None:
            raise InvalidRequestError(
                f"{self.structured_outputs.source} cannot be combined with beam search: beam "
                "search ranks continuations the grammar would have to cut", param="use_beam_search")
        if self.use_beam_search:
            _check(self.temperature < _SAMPLING_EPS, "temperature", self.temperature,
                   "0 with beam search")
        else:
            _check(self.length_penalty == 1.0, "length_penalty", self.length_penalty,
                   "1.0 without beam search")

    @property
    def sampling_type(self) -> SamplingType:
        if self.use_beam_search:
            return SamplingType.BEAM
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM

    @property
    def num_samples(self) -> int:
        """The outputs generated: ``best_of``, which is ``n`` unless set."""
        return self.n if self.best_of is None else self.best_of

    @property
    def beam_width(self) -> int:
        return self.num_samples if self.use_beam_search else 1


@dataclass(slots=True)
class BeamSearchParams:
    """Offline beam search (``LLM.beam_search``), as in vLLM."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        _check(self.beam_width >= 1, "beam_width", self.beam_width, "at least 1")
        _check(self.max_tokens >= 1, "max_tokens", self.max_tokens, "at least 1")
        _check(self.temperature == 0.0, "temperature", self.temperature, "0 for beam search")

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            n=self.beam_width,
            best_of=self.beam_width,
            use_beam_search=True,
            temperature=0.0,
            length_penalty=self.length_penalty,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )
