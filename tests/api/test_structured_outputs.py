"""Structured output over HTTP with the openai SDK: ``response_format`` (json_object,
json_schema) in chat and completions, ``text.format`` in /v1/responses, vLLM's ``guided_*``
fields and ``structured_outputs`` object, ``chat.completions.parse`` with a pydantic model;
streamed and not, n > 1; every output parses and validates (jsonschema) even on the random
test model, since the grammar allows nothing else. Bad constraints are exact 400s."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Literal

import aiohttp
import jsonschema
import pytest
from openai import AsyncOpenAI, BadRequestError
from pydantic import BaseModel, Field

from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer
from tests.structured.schemas import SCHEMAS

MESSAGES = [{"role": "user", "content": "Describe a person in JSON."}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


def json_schema_format(schema: dict[str, Any], name: str = "person") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


async def post(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + path, json={"model": MODEL, **body}
    ) as response:
        return response.status, await response.json()


def error(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


async def test_chat_json_schema_outputs_validate_with_n_samples(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=3, temperature=1.0, seed=5, max_tokens=100,
        response_format=json_schema_format(PERSON))
    assert len(result.choices) == 3
    for choice in result.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


async def _streamed_chat(client: AsyncOpenAI, schema: dict[str, Any], seed: int) -> str:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=300,
        response_format=json_schema_format(schema, "s"), stream=True)
    parts, reasons = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert reasons[-1] == "stop"
    return "".join(parts)


async def test_the_schema_corpus_validates_streamed(client: AsyncOpenAI) -> None:
    texts = await asyncio.gather(*(_streamed_chat(client, schema, seed)
                                   for seed, schema in enumerate(SCHEMAS)))
    for schema, text in zip(SCHEMAS, texts, strict=True):
        jsonschema.validate(json.loads(text), schema)


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog", "fish"]
    legs: int = Field(ge=0, le=4)
    vaccinated: bool


async def test_parse_returns_the_pydantic_object(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=2, max_tokens=100,
        response_format=Pet)
    message = result.choices[0].message
    assert isinstance(message.parsed, Pet)
    assert message.parsed == Pet.model_validate_json(message.content)


@pytest.mark.parametrize(("extra", "check"), [
    ({"guided_json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON)),
    ({"guided_regex": "[a-c]{2}-[0-9]{3}"},
     lambda text: text[2] == "-" and set(text[:2]) <= set("abc") and text[3:].isdigit()),
    ({"guided_choice": ["red", "green", "blue"]},
     lambda text: text in ("red", "green", "blue")),
    ({"guided_grammar": 'root ::= "(" [1-9] ("+" [1-9])* ")"'},
     lambda text: text[0] == "(" and text[-1] == ")" and eval(text) > 0),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda text: text in ("yes", "no")),
    ({"response_format": json_schema_format(PERSON)},
     lambda text: jsonschema.validate(json.loads(text), PERSON)),
])
async def test_completions_take_every_constraint(client: AsyncOpenAI, extra: dict[str, Any],
                                                 check: Any) -> None:
    result = await client.completions.create(model=MODEL, prompt=["Say:", "Tell:"], n=2,
                                             temperature=1.0, seed=9, max_tokens=100,
                                             extra_body=extra)
    assert len(result.choices) == 4
    for choice in result.choices:
        assert choice.finish_reason == "stop"
        assert check(choice.text) is not False, choice.text


async def test_responses_text_format_json_schema(client: AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL, input="A person, please.", temperature=1.0, max_output_tokens=100,
        extra_body={"seed": 3},
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                         "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.type == "json_schema" and response.text.format.name == "person"


async def test_responses_parse_returns_the_pydantic_object(client: AsyncOpenAI) -> None:
    response = await client.responses.parse(model=MODEL, input="A pet, please.",
                                            temperature=1.0, max_output_tokens=100,
                                            text_format=Pet, extra_body={"seed": 3})
    assert isinstance(response.output_parsed, Pet)
    assert response.output_parsed == Pet.model_validate_json(response.output_text)


async def test_json_object_output_is_an_object_or_its_prefix(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0.0, max_tokens=40,
        response_format={"type": "json_object"})
    choice = result.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # random weights write long strings; what there is opens an object
        assert choice.message.content.startswith("{")


# A tag around an integer (tool formats build theirs from the same parts, behind a trigger).
INTEGER_TAG = {"type": "structural_tag", "format": {
    "type": "tag", "begin": "<n>", "end": "</n>",
    "content": {"type": "json_schema",
                "json_schema": {"type": "integer", "minimum": 0, "maximum": 99}}}}


async def test_a_structural_tag_constrains_the_text(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=3, max_tokens=20,
        extra_body={"structured_outputs": {"structural_tag": json.dumps(INTEGER_TAG)}})
    text = result.choices[0].message.content
    assert result.choices[0].finish_reason == "stop"
    assert text.startswith("<n>") and text.endswith("</n>")
    assert 0 <= int(text[3:-4]) <= 99


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"response_format": json_schema_format({"type": "strin"})},
     'invalid JSON schema in response_format.json_schema.schema: Unsupported type "strin"',
     "response_format.json_schema.schema"),
    ({"guided_regex": "a(b"},
     "invalid regex in guided_regex: Regex parsing error at position 4: The parenthesis is "
     "not closed.", "guided_regex"),
    ({"guided_grammar": "root ::= nothing"},
     'invalid grammar in guided_grammar: EBNF parser error at line 1, column 10: Rule '
     '"nothing" is not defined', "guided_grammar"),
    ({"guided_choice": []}, "guided_choice must be a non-empty list of non-empty strings, "
     "got []", "guided_choice"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}},
     "response_format and guided_regex both constrain the output: send one", "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs must set exactly one of json, regex, choice, grammar, "
     "structural_tag and json_object, got ['regex', 'choice']", "structured_outputs"),
    ({"structured_outputs": {"structural_tag": {"type": "structural_tag",
                                                "format": {"type": "nope"}}}},
     "invalid structural tag in structured_outputs.structural_tag: Invalid structural tag "
     "error: Format type not recognized: nope", "structured_outputs.structural_tag"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema is required",
     "response_format.json_schema"),
    ({"response_format": {"type": "structural_tag"}},
     'response_format.type "structural_tag" is not supported: use "text", "json_object" or '
     '"json_schema"', "response_format.type"),
    ({"guided_json": PERSON, "use_beam_search": True, "n": 2},
     "guided_json cannot be combined with beam search: beam search ranks continuations the "
     "grammar would have to cut", "use_beam_search"),
])
async def test_bad_constraints_are_exact_400s(server: LiveServer, body: dict[str, Any],
                                              message: str, param: str) -> None:
    chat = {"messages": MESSAGES, "max_tokens": 4, **body}
    assert await post(server, "/v1/chat/completions", chat) == (400, error(message, param))


async def test_the_engine_serves_on_after_bad_constraints(client: AsyncOpenAI) -> None:
    with pytest.raises(BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                             extra_body={"guided_regex": "("})
    result = await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                  max_tokens=20,
                                                  extra_body={"guided_choice": ["ok"]})
    assert result.choices[0].message.content == "ok"


async def test_a_slow_compilation_is_refused_by_its_timeout(
        server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stuck(spec: Any) -> None:  # a compilation that has not ended when the timeout comes
        release.wait(30)

    monkeypatch.setattr(server.engine.engine, "compile_grammar", stuck)
    monkeypatch.setattr(server.engine.engine_args, "grammar_compile_timeout", 0.05)
    try:
        answer = await post(server, "/v1/chat/completions",
                            {"messages": MESSAGES, "guided_json": PERSON})
    finally:
        release.set()
    assert answer == (400, error("guided_json took longer than 0.05 s to compile; simplify it "
                                 "(the server's --grammar-compile-timeout)", "guided_json"))
