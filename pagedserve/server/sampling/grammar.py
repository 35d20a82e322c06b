"""Grammars for structured output, compiled by xgrammar against the model's vocabulary.

``GrammarCompiler.compile`` turns a request's ``StructuredOutputsParams`` into a compiled
grammar once; a bounded LRU keeps the latest ones, so a client that sends the same schema
again skips compilation and one that sends endless new schemas cannot grow the cache.
``GrammarState`` is one sequence's position in its grammar (an xgrammar matcher): the
scheduler advances it with each accepted token, and the sampler asks it which tokens may
come next.

The vocabulary xgrammar sees is the tokenizer's bytes per id (``Tokenizer.token_bytes``);
special tokens and ids without text become empty, which xgrammar never allows, except the
stop tokens, which it allows exactly where the grammar may end.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import torch

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar


def _xgrammar():
    """xgrammar, imported on first use: with its imports (torch's, transformers') it takes
    about a second of a server's start-up, which a server without structured output would
    spend for nothing."""
    import xgrammar

    return xgrammar


class TokenVocabulary(Protocol):
    """What the compiler reads of a tokenizer (``Tokenizer`` has it)."""

    vocab_size: int
    all_special_ids: frozenset[int]

    def token_bytes(self, token_id: int) -> bytes: ...


DEFAULT_CACHE_SIZE = 256
# xgrammar prefixes its messages with a time and a C++ source location; a client needs
# neither.
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")
# xgrammar's classes for a JSON string's characters, as it writes them: the length-bounded one
# lets raw control characters through (JSON allows them only escaped), and both let UTF-16
# surrogates through as 3-byte sequences, which are not UTF-8 (the text would decode to
# U+FFFD). Each is replaced by the strict class.
_STRING_CHAR_CLASSES = (r'[^\"\\\r\n]', r'[^\0-\x1f\"\\\r\n]')
_STRICT_STRING_CHAR = r'[^\0-\x1f\"\\\ud800-\udfff]'


class GrammarCompiler:
    """Compiles constraints for one vocabulary; thread-safe (the server compiles off its
    event loop while the engine thread reads the cache)."""

    def __init__(self, vocab: list[bytes], stop_token_ids: Iterable[int],
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        self.vocab_size = len(vocab)
        xgrammar = _xgrammar()
        info = xgrammar.TokenizerInfo(vocab, vocab_type=xgrammar.VocabType.RAW,
                                      vocab_size=len(vocab),
                                      stop_token_ids=sorted(set(stop_token_ids)))
        # xgrammar's own cache is unbounded by count; ours is the one that holds grammars.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple, xgrammar.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer: TokenVocabulary, vocab_size: int,
                      stop_token_ids: Iterable[int],
                      cache_size: int = DEFAULT_CACHE_SIZE) -> GrammarCompiler:
        """The compiler for a model of ``vocab_size`` rows (which may exceed the tokenizer's)."""
        stops = set(stop_token_ids)
        vocab = [b"" if i in tokenizer.all_special_ids and i not in stops else
                 tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b""
                 for i in range(vocab_size)]
        return cls(vocab, stops, cache_size)

    def __len__(self) -> int:
        return len(self._cache)

    def compile(self, spec: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        """The compiled grammar of ``spec``; InvalidRequestError names what is wrong with
        an invalid schema, regex or grammar."""
        key = spec.key()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        compiled = self._compile(spec)
        with self._lock:
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        try:
            return self._by_kind(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            what = {"json": "JSON schema", "regex": "regex", "grammar": "grammar",
                    "choice": "choice", "json_object": "JSON grammar",
                    "structural_tag": "structural tag"}[spec.kind]
            raise InvalidRequestError(f"invalid {what} in {spec.source}: {native_message(exc)}",
                                      param=spec.source) from exc

    def _by_kind(self, spec: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        compiler = self._compiler
        json_layout = {"any_whitespace": spec.any_whitespace}
        if spec.json_object or spec.json is not None:
            schema = ('{"type": "object"}' if spec.json_object else
                      spec.json if isinstance(spec.json, str) else json.dumps(spec.json))
            return compiler.compile_grammar(
                _strict_strings(_xgrammar().Grammar.from_json_schema(schema, **json_layout)))
        if spec.structural_tag is not None:
            return compiler.compile_grammar(
                _strict_strings(_xgrammar().Grammar.from_structural_tag(spec.structural_tag)))
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
            return compiler.compile_grammar(f"root ::= {alternatives}")
        return compiler.compile_grammar(spec.grammar)


def _strict_strings(grammar: xgrammar.Grammar) -> str:
    """The grammar's EBNF with each JSON string's character class made strict."""
    ebnf = str(grammar)
    for loose in _STRING_CHAR_CLASSES:
        ebnf = ebnf.replace(loose, _STRICT_STRING_CHAR)
    return ebnf


def native_message(exc: BaseException) -> str:
    """The first line of xgrammar's message, without its native-code prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _NATIVE_PREFIX.sub("", text)


class GrammarState:
    """One sequence's place in its grammar; forks copy it (``n > 1`` samples diverge)."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: xgrammar.GrammarMatcher) -> None:
        self._matcher = matcher

    @classmethod
    def start(cls, compiled: xgrammar.CompiledGrammar) -> GrammarState:
        return cls(_xgrammar().GrammarMatcher(compiled))

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False (state unchanged) if the grammar forbids it."""
        return self._matcher.accept_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """The grammar ended (its stop token was accepted): nothing may follow."""
        return self._matcher.is_terminated()

    @property
    def is_completed(self) -> bool:
        """The tokens so far form a whole string of the grammar (it may end here)."""
        return self._matcher.is_completed()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> GrammarState:
        return GrammarState(self._matcher.fork())


def grammar_bitmask(states: list[GrammarState | None], vocab_size: int
                    ) -> tuple[torch.Tensor, list[int]] | None:
    """int32 ``[N, ceil(V/32)]`` (bit ``t`` of a row set where token ``t`` may come next) and
    the rows it constrains; ``None`` when no row has a grammar. Filled on the CPU."""
    rows = [i for i, state in enumerate(states) if state is not None]
    if not rows:
        return None
    bitmask = _xgrammar().allocate_token_bitmask(len(states), vocab_size)
    for i in rows:
        states[i].fill_bitmask(bitmask, i)
    return bitmask, rows


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, every logit the bitmask forbids on ``rows``."""
    _xgrammar().apply_token_bitmask_inplace(
        logits, bitmask.to(logits.device, non_blocking=True), vocab_size=logits.shape[1],
        indices=rows)
