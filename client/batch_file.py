"""JSONL in, JSONL out, with resume.

Input lines are either OpenAI batch-file lines, ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions", "body": {...}}``, or plain ones: ``{"id" (or
"custom_id"), "body": {...}}`` or ``{"id", <body fields>}``, whose endpoint is the default
kind or else inferred (``messages`` → chat, ``prompt`` → completions). Ids must be unique.

Each output line is ``{"custom_id", "response": {"status_code", "body"} | null, "error":
{"type", "message"} | null, "endpoint", "attempts"}``, appended with one write and one flush as
the item finishes, so a crash leaves at most one torn last line. Resuming truncates that line
and skips every id the output already holds, so each input ends with exactly one result.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pagedserve.client.batch import ENDPOINT_PATHS, BatchRequest, BatchResult
from pagedserve.client.errors import BatchInputError
from pagedserve.client.tokens import EndpointKind

_KIND_BY_PATH: dict[str, EndpointKind] = {path: kind for kind, path in ENDPOINT_PATHS.items()}
_OPENAI_BATCH_KEYS = frozenset({"custom_id", "method", "url", "body"})


def _kind_of(
    body: dict[str, Any], url: Any, default: EndpointKind | None, where: tuple[str, int]
) -> EndpointKind:
    if url is not None:
        path = str(url).split("?", 1)[0].rstrip("/")
        path = path if path.startswith("/v1/") else "/v1/" + path.lstrip("/").removeprefix("v1/")
        if path not in _KIND_BY_PATH:
            expected = sorted(_KIND_BY_PATH)
            raise BatchInputError(*where, f"url must be one of {expected}, got {url!r}")
        return _KIND_BY_PATH[path]
    if default is not None:
        return default
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completions"
    raise BatchInputError(*where, "cannot tell the endpoint: the body has no messages or prompt")


def parse_request_line(
    line: bytes,
    where: tuple[str, int],
    default_kind: EndpointKind | None = None,
    default_model: str | None = None,
) -> BatchRequest:
    """One input line as a ``BatchRequest``; ``where`` is (source name, line number)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        text = line.decode("utf-8", errors="replace").strip()
        raise BatchInputError(*where, f"not valid JSON: {text[:80]!r}") from exc
    if not isinstance(record, dict):
        raise BatchInputError(*where, f"expected a JSON object, got {type(record).__name__}")
    custom_id = record.get("custom_id", record.get("id"))
    if isinstance(custom_id, int) and not isinstance(custom_id, bool):
        custom_id = str(custom_id)
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchInputError(*where, "every line needs a non-empty 'custom_id' or 'id'")
    method = record.get("method", "POST")
    if method != "POST":
        raise BatchInputError(*where, f"method must be POST, got {method!r}")
    if "body" in record:
        body = record["body"]
        if not isinstance(body, dict):
            raise BatchInputError(*where, "'body' must be a JSON object")
        body = dict(body)
    else:
        body = {k: v for k, v in record.items() if k not in _OPENAI_BATCH_KEYS | {"id"}}
    if default_model is not None:
        body.setdefault("model", default_model)
    return BatchRequest(custom_id, _kind_of(body, record.get("url"), default_kind, where), body)


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


@dataclass(slots=True, frozen=True)
class InputScan:
    total: int  # requests in the file
    remaining: int  # of those, not yet in the output
    without_model: int  # of the remaining, bodies that name no model


def scan_input(
    path: Path,
    done: set[str] | frozenset[str] = frozenset(),
    default_kind: EndpointKind | None = None,
    default_model: str | None = None,
) -> InputScan:
    """Check every line of ``path`` before anything is sent: a bad line 90,000 lines in
    should not surface after hours of work."""
    seen: dict[str, int] = {}
    remaining = without_model = 0
    for number, line in _numbered_lines(path):
        request = parse_request_line(line, (str(path), number), default_kind, default_model)
        if request.custom_id in seen:
            raise BatchInputError(
                str(path),
                number,
                f"duplicate id {request.custom_id!r} (first on line {seen[request.custom_id]})",
            )
        seen[request.custom_id] = number
        if request.custom_id not in done:
            remaining += 1
            without_model += "model" not in request.body
    return InputScan(len(seen), remaining, without_model)


def iter_requests(
    path: Path,
    done: set[str] | frozenset[str] = frozenset(),
    default_kind: EndpointKind | None = None,
    default_model: str | None = None,
) -> Iterator[BatchRequest]:
    """The requests of ``path`` whose ids are not in ``done``, read lazily."""
    for number, line in _numbered_lines(path):
        request = parse_request_line(line, (str(path), number), default_kind, default_model)
        if request.custom_id not in done:
            yield request


def _truncate_torn_tail(handle: BinaryIO, chunk_size: int = 1 << 16) -> None:
    """Cut the file back to just after its last newline."""
    end = handle.seek(0, os.SEEK_END)
    position = end
    while position > 0:
        start = max(0, position - chunk_size)
        handle.seek(start)
        block = handle.read(position - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        position = start
    else:
        keep = 0
    if keep < end:
        handle.truncate(keep)


def repair_and_load_done(path: Path) -> set[str]:
    """Ids already in the output file ``path``, after cutting off a torn last line."""
    if not path.exists():
        return set()
    with path.open("r+b") as handle:
        _truncate_torn_tail(handle)
    done: set[str] = set()
    for number, line in _numbered_lines(path):
        try:
            done.add(str(orjson.loads(line)["custom_id"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise BatchInputError(
                str(path), number, "corrupt output line; it is not a result this tool wrote"
            ) from None
    return done


def result_record(result: BatchResult) -> dict[str, Any]:
    response = None
    if result.status_code is not None:
        response = {"status_code": result.status_code, "body": result.response}
    error = None
    if result.error is not None:
        error = {"type": result.error.type, "message": result.error.message}
    return {
        "custom_id": result.custom_id,
        "response": response,
        "error": error,
        "endpoint": result.endpoint,
        "attempts": result.attempts,
    }


class ResultWriter:
    """Appends one JSON line per result: a single write, then flush, so a line is whole or
    (after a crash mid-write) the torn last line that resume repairs."""

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self._handle: BinaryIO | None = path.open("ab")

    def write(self, result: BatchResult) -> None:
        if self._handle is None:
            raise ValueError(f"result writer for {self.path} is closed")
        self._handle.write(orjson.dumps(result_record(result)) + b"\n")
        self._handle.flush()
        if self.fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
