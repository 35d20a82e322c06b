"""The corpus of JSON schemas for structured-output tests and ``benchmarks/structured.py``
(``benchmarks/json_schemas.json``): nested objects, arrays, enums, bounded numbers, required
and optional fields, ``anyOf``, ``$ref``. Every string, number and array is bounded, so that
a constrained output ends within a few hundred tokens even on random weights (an unbounded
string ends only when the model picks the closing quote)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "json_schemas.json"
SCHEMAS: list[dict[str, Any]] = json.loads(CORPUS.read_text(encoding="utf-8"))
