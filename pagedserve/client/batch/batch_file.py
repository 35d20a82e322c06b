"""JSONL in, JSONL out, with resume.

Input lines are either OpenAI batch-file lines, ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions" | "/v1/responses", "body": {...}}``, or plain
ones: ``{"id" (or "custom_id"), "body": {...}}`` or ``{"id", <body fields>}``, whose endpoint
is the default kind or else inferred (``messages`` → chat, ``prompt`` → completions,
``input`` → responses). Ids must be unique.

Each output line has the OpenAI Batch API's output shape, so a file from that API and one
from here compare line for line::

    {"id": "batch_req_…", "custom_id": …,
     "response": {"status_code", "request_id", "body"} | null,
     "error": {"code", "message"} | null,
     "pagedserve": {"attempts", "endpoint", "error_type"}}

An HTTP answer, an error status included, fills ``response`` (its body is the server's error
object) and leaves ``error`` null; ``error`` is for failures without an HTTP answer (the
server unreachable, a timeout, a request the client refused to send). pagedserve's own fields
live under ``"pagedserve"``.

A line is appended with one write and one flush as its item finishes, so a crash leaves at
most one torn last line. Rerunning truncates that line and skips every id the output already
holds with a successful (2xx) result; lines whose result is a failure are removed and their
requests sent again (unless ``retry_failed`` is off), so each input ends with exactly one
result line.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pagedserve.client.api.client_errors import BatchInputError
from pagedserve.client.batch.items import ENDPOINT_PATHS, BatchRequest, BatchResult
from pagedserve.client.budget.tokens import EndpointKind

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
    if "input" in body:
        return "responses"
    raise BatchInputError(*where, "cannot tell the endpoint: the body has no messages, prompt "
                                  "or input")


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
    kept_failures: int = 0  # of those done, the ones in ``failed`` (a failure kept as is)


def scan_input(
    path: Path,
    done: set[str] | frozenset[str] = frozenset(),
    default_kind: EndpointKind | None = None,
    default_model: str | None = None,
    failed: set[str] | frozenset[str] = frozenset(),
) -> InputScan:
    """Check every line of ``path`` before anything is sent: a bad line 90,000 lines in
    should not surface after hours of work."""
    seen: dict[str, int] = {}
    remaining = without_model = kept_failures = 0
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
        elif request.custom_id in failed:
            kept_failures += 1
    return InputScan(len(seen), remaining, without_model, kept_failures)


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


def is_success(record: dict[str, Any]) -> bool:
    """Whether an output line holds a successful answer: no error and a 2xx response."""
    response = record.get("response")
    if record.get("error") is not None or not isinstance(response, dict):
        return False
    status = response.get("status_code")
    return isinstance(status, int) and 200 <= status < 300


@dataclass(slots=True, frozen=True)
class PreviousResults:
    """The ids of an existing output file, by outcome; an id with a success line counts as
    succeeded whatever else the file holds for it."""

    succeeded: frozenset[str]
    failed: frozenset[str]


def _read_records(path: Path) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    for number, line in _numbered_lines(path):
        try:
            record = orjson.loads(line)
            record["custom_id"] = str(record["custom_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise BatchInputError(
                str(path), number, "corrupt output line; it is not a result this tool wrote"
            ) from None
        yield number, line, record


def load_previous_results(path: Path) -> PreviousResults:
    """The ids already in the output file ``path``, after cutting off a torn last line."""
    if not path.exists():
        return PreviousResults(frozenset(), frozenset())
    with path.open("r+b") as handle:
        _truncate_torn_tail(handle)
    succeeded: set[str] = set()
    seen: set[str] = set()
    for _, _, record in _read_records(path):
        seen.add(record["custom_id"])
        if is_success(record):
            succeeded.add(record["custom_id"])
    return PreviousResults(frozenset(succeeded), frozenset(seen - succeeded))


def drop_results(path: Path, ids: set[str] | frozenset[str]) -> None:
    """Rewrite ``path`` without the lines of ``ids``: written beside it, then renamed over
    it, so a crash leaves either the old file or the new one."""
    if not ids or not path.exists():
        return
    scratch = path.with_name(path.name + ".rewrite")
    with scratch.open("wb") as out:
        for _, line, record in _read_records(path):
            if record["custom_id"] not in ids:
                out.write(line if line.endswith(b"\n") else line + b"\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(scratch, path)


def result_record(result: BatchResult) -> dict[str, Any]:
    """One output line in the OpenAI Batch API's shape (see the module docstring)."""
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    if result.status_code is not None:
        response = {
            "status_code": result.status_code,
            "request_id": result.request_id,
            "body": result.response,
        }
    elif result.error is not None:
        error = {"code": result.error.code, "message": result.error.message}
    extra: dict[str, Any] = {"attempts": result.attempts, "endpoint": result.endpoint}
    if result.error is not None:
        extra["error_type"] = result.error.type
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": result.custom_id,
        "response": response,
        "error": error,
        "pagedserve": extra,
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
