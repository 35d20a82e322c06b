"""``--response-format``: json_object, or a schema file sent as a strict json_schema, merged
into every request body beside ``--extra-body``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedserve.loadgen.bench_errors import BenchConfigError
from pagedserve.loadgen.cli_options import response_format

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_json_object_and_a_schema_file(tmp_path: Path) -> None:
    assert response_format(None) == {}
    assert response_format("json_object") == {"response_format": {"type": "json_object"}}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(SCHEMA))
    assert response_format(str(path)) == {"response_format": {"type": "json_schema",
                                                              "json_schema": {
        "name": "record", "schema": SCHEMA, "strict": True}}}


def test_a_bad_schema_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(BenchConfigError, match="--response-format must be json_object or a "
                                               "readable JSON schema file"):
        response_format(str(tmp_path / "missing.json"))
    path = tmp_path / "list.json"
    path.write_text("[1]")
    with pytest.raises(BenchConfigError, match="--response-format must be a JSON object"):
        response_format(str(path))
