"""A corpus of JSON schemas for structured-output tests: nested objects, arrays, enums,
bounded numbers, required and optional fields, ``anyOf``, ``$ref``. Every string, number and
array is bounded, so that a constrained output ends within a few hundred tokens even on
random weights (an unbounded string ends only when the model picks the closing quote)."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "maxLength": 8}
_SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}
_SCORE = {"type": "number", "minimum": -10, "maximum": 10}
_TAGS = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False}


SCHEMAS: list[dict[str, Any]] = [
    _object({"name": _NAME}),
    _object({"age": _SMALL_INT}),
    _object({"ok": {"type": "boolean"}}),
    _object({"color": {"enum": ["red", "green", "blue"]}}),
    _object({"score": _SCORE}),
    _object({"tags": _TAGS}),
    _object({"name": _NAME, "age": _SMALL_INT, "ok": {"type": "boolean"}}),
    _object({"name": _NAME, "nickname": _NAME}, required=["name"]),
    _object({"x": _SMALL_INT, "y": _SMALL_INT}, required=[]),
    _object({"point": _object({"x": _SCORE, "y": _SCORE})}),
    _object({"outer": _object({"inner": _object({"leaf": {"enum": [1, 2, 3]}})})}),
    _object({"items": {"type": "array", "items": _object({"id": _SMALL_INT}),
                       "minItems": 1, "maxItems": 3}}),
    _object({"matrix": {"type": "array", "maxItems": 2,
                        "items": {"type": "array", "items": _SMALL_INT, "maxItems": 2}}}),
    _object({"value": {"anyOf": [_SMALL_INT, {"type": "boolean"}]}}),
    _object({"value": {"anyOf": [_object({"kind": {"const": "a"}, "a": _SMALL_INT}),
                                 _object({"kind": {"const": "b"}, "b": _NAME})]}}),
    _object({"status": {"type": "string", "enum": ["open", "closed", "pending"]},
             "priority": {"type": "integer", "minimum": 1, "maximum": 5}}),
    _object({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    _object({"temperature": {"type": "number", "minimum": 0, "maximum": 1}}),
    _object({"count": {"type": "integer", "minimum": -5, "maximum": 5}}),
    _object({"maybe": {"anyOf": [_NAME, {"type": "null"}]}}),
    _object({"flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}}),
    _object({"pair": {"type": "array", "prefixItems": [_SMALL_INT, {"type": "boolean"}],
                      "items": False}}),
    _object({"user": _object({"name": _NAME, "roles": _TAGS}),
             "active": {"type": "boolean"}}),
    _object({"answer": {"const": "yes"}}),
    _object({"people": {"type": "array", "maxItems": 2,
                        "items": _object({"name": _NAME, "age": _SMALL_INT})}}),
    _object({"a": _SMALL_INT, "b": _SMALL_INT, "c": _SMALL_INT, "d": _SMALL_INT}),
    _object({"level": {"enum": ["low", "mid", "high"]}, "note": _NAME}, required=["level"]),
    _object({"id": {"type": "string", "minLength": 2, "maxLength": 4}}),
    {"type": "array", "items": _SMALL_INT, "minItems": 1, "maxItems": 4},
    {"enum": ["alpha", "beta", "gamma"]},
    {"type": "integer", "minimum": 10, "maximum": 20},
    {"$defs": {"node": _object({"v": _SMALL_INT})},
     **_object({"first": {"$ref": "#/$defs/node"}, "second": {"$ref": "#/$defs/node"}})},
]
