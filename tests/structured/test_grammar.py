"""The grammar compiler (errors, the bounded cache) and the grammar mask in the sampler."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.common.sampling_params import StructuredOutputsParams as Spec
from pagedserve.server.sampling.grammar import GrammarCompiler, GrammarState
from pagedserve.server.sampling.metadata import SamplingMetadata
from pagedserve.server.sampling.sampler import Sampler
from pagedserve.server.sampling.sampling_row import SamplingRow

# A byte vocabulary small enough to reason about: id 0 is the stop token, 1 a special
# token without text, then single characters and a few multi-character tokens.
CHARS = list('{}[]":, 0123456789abcdefghijklmnopqrstuvwxyz-')
VOCAB = [b"", b"", *(c.encode() for c in CHARS), b'{"', b'":', b"yes", b"no"]
STOP = 0


def token(text: str) -> int:
    return VOCAB.index(text.encode())


@pytest.fixture
def compiler() -> GrammarCompiler:
    return GrammarCompiler(VOCAB, [STOP], cache_size=2)


@pytest.mark.parametrize(("spec", "message"), [
    (Spec(json={"type": "strin"}, source="response_format"),
     'invalid JSON schema in response_format: Unsupported type "strin"'),
    (Spec(json="{nope", source="guided_json"),
     "invalid JSON schema in guided_json: Failed to parse JSON: syntax error at line 1 near: "
     "nope. The JSON string is:{nope"),
    (Spec(regex="a(b", source="guided_regex"),
     "invalid regex in guided_regex: Regex parsing error at position 4: The parenthesis is "
     "not closed."),
    (Spec(grammar="root ::= foo", source="guided_grammar"),
     'invalid grammar in guided_grammar: EBNF parser error at line 1, column 10: Rule "foo" '
     "is not defined"),
])
def test_an_invalid_constraint_is_a_request_error_naming_it(
        compiler: GrammarCompiler, spec: Spec, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        compiler.compile(spec)
    assert str(info.value) == message
    assert info.value.param == spec.source


def test_a_constraint_sets_exactly_one_kind() -> None:
    with pytest.raises(InvalidRequestError, match=r"exactly one of .* got \['json', 'regex'\]"):
        Spec(json={}, regex="a")
    with pytest.raises(InvalidRequestError, match="got none"):
        Spec()
    with pytest.raises(InvalidRequestError, match="choice must be a non-empty list"):
        Spec(choice=[])


def test_the_cache_keeps_the_latest_grammars_and_no_more(compiler: GrammarCompiler) -> None:
    first = compiler.compile(Spec(choice=["yes"]))
    compiler.compile(Spec(choice=["no"]))
    assert compiler.compile(Spec(choice=["yes"])) is first  # a hit, and now the latest
    compiler.compile(Spec(regex="[ab]"))  # evicts ["no"], the least recently used
    assert len(compiler) == 2
    assert compiler.compile(Spec(choice=["yes"])) is first
    # Key order does not make a schema new.
    a = compiler.compile(Spec(json={"type": "object", "required": []}))
    assert compiler.compile(Spec(json={"required": [], "type": "object"})) is a


def _allowed(compiler: GrammarCompiler, spec: Spec, text: str = "") -> set[str]:
    state = GrammarState.start(compiler.compile(spec))
    for char in text:
        assert state.accept(token(char))
    bitmask = torch.zeros(1, (len(VOCAB) + 31) // 32, dtype=torch.int32)
    state.fill_bitmask(bitmask, 0)
    bits = bitmask[0].tolist()
    return {VOCAB[t].decode() or f"<{t}>" for t in range(len(VOCAB))
            if bits[t // 32] >> (t % 32) & 1}


def test_the_mask_follows_the_grammar_and_allows_the_stop_token_at_its_end(
        compiler: GrammarCompiler) -> None:
    spec = Spec(choice=["yes", "no"])
    assert _allowed(compiler, spec) == {"y", "n", "yes", "no"}
    assert _allowed(compiler, spec, "ye") == {"s"}
    assert _allowed(compiler, spec, "no") == {f"<{STOP}>"}


def test_a_fork_goes_its_own_way(compiler: GrammarCompiler) -> None:
    parent = GrammarState.start(compiler.compile(Spec(regex="a[bc]d")))
    assert parent.accept(token("a"))
    child = parent.fork()
    assert child.accept(token("b")) and parent.accept(token("c"))
    assert not child.accept(token("c"))
    assert child.accept(token("d")) and child.accept(STOP) and child.is_terminated
    assert not parent.is_terminated


def _rows(compiler: GrammarCompiler, free: SamplingParams) -> list[SamplingRow]:
    grammar = compiler.compile(Spec(choice=["yes", "no"]))
    greedy = SamplingParams(temperature=0.0)
    return [SamplingRow(greedy, [5], [], grammar=GrammarState.start(grammar)),
            SamplingRow(free, [5], []),
            SamplingRow(SamplingParams(temperature=1.0, seed=3), [5], [],
                        grammar=GrammarState.start(grammar))]


def _favouring_x() -> torch.Tensor:
    logits = torch.zeros(3, len(VOCAB))
    logits[:, token("x")] = 10.0
    logits[:, token("n")] = 1.0
    return logits


def test_constrained_and_free_rows_share_one_sampler_call(compiler: GrammarCompiler) -> None:
    # Logits that favour "x" everywhere: the free row takes it, the constrained rows cannot.
    logits = _favouring_x()
    rows = _rows(compiler, SamplingParams(temperature=0.0, logprobs=0))
    out = Sampler(seed=0)(logits, SamplingMetadata.build(rows, len(VOCAB), "cpu"))
    assert out.sampled_token_ids[0].item() == token("n")
    assert out.sampled_token_ids[1].item() == token("x")
    assert VOCAB[out.sampled_token_ids[2].item()] in (b"y", b"n", b"yes", b"no")
    assert torch.equal(logits, _favouring_x())  # logprobs come from the raw logits
    assert out.sampled_logprobs[1].item() == pytest.approx(
        torch.log_softmax(_favouring_x()[1], -1)[token("x")].item(), rel=1e-4)


def test_without_logprobs_the_mask_is_written_in_place(compiler: GrammarCompiler) -> None:
    logits = _favouring_x()
    rows = _rows(compiler, SamplingParams(temperature=0.0))
    out = Sampler(seed=0)(logits, SamplingMetadata.build(rows, len(VOCAB), "cpu"))
    assert out.sampled_token_ids[:2].tolist() == [token("n"), token("x")]
    allowed = {token(t) for t in ("y", "n", "yes", "no")}
    for row in (0, 2):
        assert {t for t in range(len(VOCAB)) if logits[row, t] > float("-inf")} == allowed
    assert torch.equal(logits[1], _favouring_x()[1])


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "maxLength": 4}])
@pytest.mark.parametrize(("raw", "allowed"), [
    (b"\xe4\xb8\xad", True),  # a CJK character
    (b"\xed\xa0\x80", False),  # a UTF-16 surrogate: not UTF-8
    (b"\x01", False),  # a control character JSON allows only escaped
    (b"\x7f", True),
])
def test_json_strings_hold_only_what_json_loads_reads(schema: dict, raw: bytes,
                                                      allowed: bool) -> None:
    vocab = [b"", *(bytes([b]) for b in range(256))]  # id 0 stops, id b + 1 is byte b
    state = GrammarState.start(GrammarCompiler(vocab, [0]).compile(Spec(json=schema)))
    assert all(state.accept(b + 1) for b in b'"')
    assert all(state.accept(b + 1) for b in raw) == allowed
