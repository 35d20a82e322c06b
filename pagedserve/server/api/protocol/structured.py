"""The request fields that constrain an output, read into one ``StructuredOutputsParams``:
OpenAI's ``response_format`` (chat and completions) and ``text.format`` (Responses), vLLM's
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` and its
``structured_outputs`` object. A request sets at most one constraint."""

from __future__ import annotations

import json
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.api.protocol.fields import Fields, show, type_error

# vLLM's backend choice: this server has one engine, so only the names that mean "any".
_BACKENDS = ("auto", "xgrammar")
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def read_structured_outputs(fields: Fields, *, response_format: bool = True
                            ) -> StructuredOutputsParams | None:
    """The one constraint the request sets, or None; a 400 for two, or a malformed one."""
    found = [spec for spec in (
        _read_response_format(fields.object("response_format")) if response_format else None,
        *_read_guided(fields),
        _read_structured_outputs(fields.object("structured_outputs")),
    ) if spec is not None]
    if len(found) > 1:
        raise InvalidRequestError(
            f"{found[0].source} and {found[1].source} both constrain the output: send one",
            param=found[1].source)
    return found[0] if found else None


def _read_response_format(value: Fields | None) -> StructuredOutputsParams | None:
    if value is None:
        return None
    kind = value.string("type", required=True)
    if kind == "text":
        spec = None
    elif kind == "json_object":
        spec = StructuredOutputsParams(json_object=True, source="response_format")
    elif kind == "json_schema":
        spec = read_json_schema(value.object("json_schema"), "response_format.json_schema")
    else:
        raise InvalidRequestError(
            f"response_format.type {show(kind)} is not supported: use \"text\", "
            "\"json_object\" or \"json_schema\"", param="response_format.type")
    value.finish()
    return spec


def read_json_schema(value: Fields | None, where: str) -> StructuredOutputsParams:
    """OpenAI's ``json_schema`` format: a ``name``, a ``schema``, ``strict`` and a
    description. The grammar always holds the output to the schema, strict or not."""
    if value is None:
        raise InvalidRequestError(f"{where} is required", param=where)
    value.string("name", required=True)
    value.string("description")
    value.boolean("strict", False)
    schema = value.raw("schema")
    value.finish()
    if schema is None:  # OpenAI's schema is optional: then any JSON object will do
        return StructuredOutputsParams(json_object=True, source=where)
    if not isinstance(schema, dict):
        raise type_error(f"{where}.schema", "a JSON schema object", schema)
    return StructuredOutputsParams(json=schema, source=f"{where}.schema")


def _read_guided(fields: Fields) -> list[StructuredOutputsParams]:
    backend = fields.string("guided_decoding_backend")
    if backend is not None and backend not in _BACKENDS:
        raise type_error("guided_decoding_backend", "one of " + ", ".join(_BACKENDS), backend)
    any_whitespace = not fields.boolean("disable_any_whitespace", True)
    specs = []
    for name in _GUIDED:
        value = fields.raw(name)
        if value is not None:
            specs.append(_spec(name.removeprefix("guided_"), value, name, any_whitespace))
    return specs


def _read_structured_outputs(value: Fields | None) -> StructuredOutputsParams | None:
    if value is None:
        return None
    any_whitespace = not value.boolean("disable_any_whitespace", True)
    value.ignore("disable_fallback", "disable_additional_properties")
    specs = []
    for kind in ("json", "regex", "choice", "grammar", "structural_tag"):
        raw = value.raw(kind)
        if raw is not None:
            specs.append(_spec(kind, raw, f"structured_outputs.{kind}", any_whitespace))
    if value.boolean("json_object", False):
        specs.append(StructuredOutputsParams(json_object=True,
                                             source="structured_outputs.json_object"))
    value.reject("whitespace_pattern")
    value.finish()
    if len(specs) != 1:
        raise InvalidRequestError(
            "structured_outputs must set exactly one of json, regex, choice, grammar, "
            "structural_tag and json_object, got "
            f"{[s.source.split('.')[-1] for s in specs] or 'none'}", param="structured_outputs")
    return specs[0]


def _spec(kind: str, value: Any, where: str, any_whitespace: bool) -> StructuredOutputsParams:
    if kind == "json":
        if isinstance(value, str | dict):
            return StructuredOutputsParams(json=value, any_whitespace=any_whitespace,
                                           source=where)
        raise type_error(where, "a JSON schema (an object or its text)", value)
    if kind == "structural_tag" and isinstance(value, dict):  # vLLM takes its text
        value = json.dumps(value)
    if kind == "choice":
        if isinstance(value, list) and value and all(isinstance(c, str) and c for c in value):
            return StructuredOutputsParams(choice=tuple(value), source=where)
        raise type_error(where, "a non-empty list of non-empty strings", value)
    if not isinstance(value, str) or not value:
        raise type_error(where, "a non-empty string", value)
    if kind == "regex":
        return StructuredOutputsParams(regex=value, source=where)
    if kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=value, source=where)
    return StructuredOutputsParams(grammar=value, source=where)
