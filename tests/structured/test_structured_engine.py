"""Structured output through the offline engine: every output of a corpus of schemas
validates; samples of one request fork their own grammar state; preemption (recompute and
swap) and prefix caching leave constrained outputs exactly as they were."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.common.sampling_params import StructuredOutputsParams as Spec
from pagedserve.server import LLM
from pagedserve.server.sampling.grammar import GrammarState
from tests.structured.schemas import SCHEMAS

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


def test_every_output_of_the_schema_corpus_validates(llm: LLM) -> None:
    params = [SamplingParams(n=2, temperature=1.0, seed=i, max_tokens=300,
                             structured_outputs=Spec(json=schema))
              for i, schema in enumerate(SCHEMAS)]
    results = llm.generate(["Answer in JSON:"] * len(SCHEMAS), params)
    for schema, result in zip(SCHEMAS, results, strict=True):
        for output in result.outputs:
            assert output.finish_reason == "stop", output.text
            jsonschema.validate(json.loads(output.text), schema)


def test_regex_choice_and_grammar_constrain_the_text(llm: LLM) -> None:
    specs = [Spec(regex=r"[a-c]{3}-[0-9]{2}"), Spec(choice=["yes", "no", "maybe"]),
             Spec(grammar='root ::= "(" num ("+" num)* ")"\nnum ::= [1-9]'),
             Spec(json_object=True)]
    results = llm.generate(["Hello"] * len(specs),
                           [SamplingParams(temperature=1.0, seed=7, max_tokens=200,
                                           structured_outputs=s) for s in specs])
    texts = [r.outputs[0].text for r in results]
    assert [r.outputs[0].finish_reason for r in results[:3]] == ["stop"] * 3
    assert len(texts[0]) == 6 and texts[0][3] == "-" and set(texts[0][:3]) <= set("abc")
    assert texts[1] in ("yes", "no", "maybe")
    assert texts[2].startswith("(") and texts[2].endswith(")")
    # Any object: its strings are unbounded, so random weights may run out of tokens first;
    # then what there is must be a prefix the grammar accepts.
    json_object = results[3].outputs[0]
    if json_object.finish_reason == "stop":
        assert isinstance(json.loads(json_object.text), dict)
    else:
        state = GrammarState.start(llm.engine.compile_grammar(specs[3]))
        assert json_object.text.startswith("{")
        assert all(state.accept(t) for t in json_object.token_ids)


def test_samples_fork_their_own_grammar_state(llm: LLM) -> None:
    (result,) = llm.generate(["People:"], SamplingParams(
        n=4, best_of=6, temperature=1.0, seed=1, max_tokens=100,
        structured_outputs=Spec(json=PERSON)))
    texts = [o.text for o in result.outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # the samples did diverge, each within the grammar


def test_a_constraint_cannot_combine_with_beam_search() -> None:
    with pytest.raises(InvalidRequestError, match="cannot be combined with beam search") as info:
        SamplingParams(n=2, use_beam_search=True, temperature=0.0,
                       structured_outputs=Spec(json=PERSON, source="response_format"))
    assert info.value.param == "use_beam_search"


def _greedy_people(llm: LLM, count: int) -> list[str]:
    prompts = [f"Person number {i} in JSON:" for i in range(count)]
    params = SamplingParams(temperature=0.0, max_tokens=60,
                            structured_outputs=Spec(json=PERSON))
    return [r.outputs[0].text for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_each_sequence_in_its_grammar(llm: LLM, model_dir: Path,
                                                       mode: str) -> None:
    expected = _greedy_people(llm, 8)
    starved = LLM(model=str(model_dir), num_kv_blocks=24, block_size=4, max_num_seqs=8,
                  max_model_len=96, preemption_mode=mode, swap_space=0.01)
    preempted: list[int] = []
    starved.engine.add_step_observer(lambda stats: preempted.append(stats.num_preempted))
    assert _greedy_people(starved, 8) == expected
    assert sum(preempted) > 0


def test_prefix_cache_hits_leave_constrained_outputs_alone(llm: LLM, model_dir: Path) -> None:
    cached = LLM(model=str(model_dir), num_kv_blocks=64, max_model_len=512,
                 enable_prefix_caching=True)
    first = _greedy_people(cached, 3)
    assert _greedy_people(cached, 3) == first == _greedy_people(llm, 3)
    assert cached.engine.scheduler.stats().prefix_cache_hit_tokens > 0



def test_free_and_constrained_requests_share_steps_unchanged(llm: LLM) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=60,
                                 structured_outputs=Spec(json=PERSON))
    prompts = ["A free reply:", "A person:"]
    alone = [llm.generate([p], [s])[0].outputs[0].token_ids
             for p, s in zip(prompts, (free, constrained), strict=True)]
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, [free, constrained])]
    assert together == alone


def test_min_tokens_past_a_complete_output_ends_it_with_stop(llm: LLM) -> None:
    """The grammar allows only the end token once "yes" is written; min_tokens bans it, so
    the mask leaves nothing. The output is whole: "stop"."""
    (result,) = llm.generate(["Hello"], SamplingParams(
        temperature=1.0, min_tokens=8, max_tokens=20, structured_outputs=Spec(choice=["yes"])))
    output = result.outputs[0]
    assert (output.text, output.finish_reason) == ("yes", "stop")


def test_a_token_outside_the_grammar_ends_the_output_with_error(
        llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampler that broke the mask must not pass a cut output off as "stop"."""
    sampler = llm.engine.sampler.sampler
    digit = llm.get_tokenizer().encode("7", add_special_tokens=False)[0]
    monkeypatch.setattr(sampler, "_sample",
                        lambda processed, metadata: torch.full((metadata.num_rows,), digit))
    (result,) = llm.generate(["Hello"], SamplingParams(
        temperature=1.0, max_tokens=20, structured_outputs=Spec(json=PERSON)))
    output = result.outputs[0]
    assert (output.token_ids, output.finish_reason) == ([], "error")
