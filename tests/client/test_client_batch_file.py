from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from pagedserve.client import BatchInputError, BatchRequest, PoolConfig, RetryPolicy, run_batch_file
from pagedserve.client.batch.batch_file import (
    load_previous_results,
    parse_request_line,
    scan_input,
)

WHERE = ("in.jsonl", 3)
FAST = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, jitter=0.0)


def write_input(path: Path, n: int) -> None:
    lines = [orjson.dumps({"id": f"r{i}", "prompt": f"p{i}", "max_tokens": 2}) for i in range(n)]
    path.write_bytes(b"\n".join(lines) + b"\n")


def read_output(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def config(url: str, tokens: int = 1000) -> PoolConfig:
    return PoolConfig(base_urls=[url], max_inflight_tokens=tokens, cooldown=FAST)


def test_openai_batch_line():
    line = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}})
    assert parse_request_line(line, WHERE) == BatchRequest(
        "a", "chat", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )


def test_plain_lines_and_defaults():
    assert parse_request_line(b'{"id": 7, "prompt": "x"}', WHERE, default_model="d") == (
        BatchRequest("7", "completions", {"prompt": "x", "model": "d"})
    )
    assert parse_request_line(b'{"id": "b", "body": {"prompt": "x", "model": "m"}}', WHERE,
                              default_model="d") == BatchRequest(
        "b", "completions", {"prompt": "x", "model": "m"}
    )
    assert parse_request_line(b'{"id": "c", "prompt": "x"}', WHERE, default_kind="chat").kind == (
        "chat"
    )
    assert parse_request_line(b'{"id": "d", "url": "v1/completions", "prompt": "x"}', WHERE,
                              default_kind="chat").kind == "completions"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": "a", "prompt": ', """not valid JSON: '{"id": "a", "prompt":'"""),
        (b'[1, 2]', "expected a JSON object, got list"),
        (b'{"prompt": "x"}', "every line needs a non-empty 'custom_id' or 'id'"),
        (b'{"id": "", "prompt": "x"}', "every line needs a non-empty 'custom_id' or 'id'"),
        (b'{"id": "a", "method": "GET", "prompt": "x"}', "method must be POST, got 'GET'"),
        (b'{"id": "a", "url": "/v1/embeddings", "body": {}}',
         "url must be one of ['/v1/chat/completions', '/v1/completions', '/v1/responses'], "
         "got '/v1/embeddings'"),
        (b'{"id": "a", "body": "x"}', "'body' must be a JSON object"),
        (b'{"id": "a", "text": "x"}',
         "cannot tell the endpoint: the body has no messages, prompt or input"),
    ],
)
def test_bad_lines(line, reason):
    with pytest.raises(BatchInputError) as info:
        parse_request_line(line, WHERE)
    assert str(info.value) == f"in.jsonl:3: {reason}"
    assert (info.value.line_number, info.value.reason) == (3, reason)


def test_scan_finds_duplicates_and_counts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n\n{"id": "b", "prompt": "y", "model": "m"}\n')
    scan = scan_input(path, done={"a"})
    assert (scan.total, scan.remaining, scan.without_model) == (2, 1, 0)
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n'
                    '{"id": "a", "prompt": "z"}\n')
    with pytest.raises(BatchInputError) as info:
        scan_input(path)
    assert str(info.value) == f"{path}:3: duplicate id 'a' (first on line 1)"


def test_torn_tail_is_cut_and_corruption_is_reported(tmp_path):
    path = tmp_path / "out.jsonl"
    ok = b'"response": {"status_code": 200, "body": {}}, "error": null'
    path.write_bytes(b'{"custom_id": "a", ' + ok + b'}\n{"custom_id": "b", "response": null}\n'
                     b'{"custom_id": "c", "resp')
    previous = load_previous_results(path)
    assert (previous.succeeded, previous.failed) == ({"a"}, {"b"})
    assert path.read_bytes().endswith(b'{"custom_id": "b", "response": null}\n')
    path.write_bytes(b'{"custom_id": "a"}\nnot json\n')
    with pytest.raises(BatchInputError) as info:
        load_previous_results(path)
    assert str(info.value) == f"{path}:2: corrupt output line; it is not a result this tool wrote"
    assert load_previous_results(tmp_path / "missing.jsonl").succeeded == set()


async def test_file_run_writes_one_result_per_line(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 3)
    with source.open("ab") as handle:
        handle.write(b'{"id": "bad", "prompt": "p-bad", "max_tokens": 2}\n')
    server, url = await serve(script={"p-bad": [("status", 400)]})
    summary = await run_batch_file(source, target, config(url))
    records = {r["custom_id"]: r for r in read_output(target)}
    assert sorted(records) == ["bad", "r0", "r1", "r2"]
    # The OpenAI Batch API's output line, pagedserve's fields under their own key.
    for record in records.values():
        assert list(record) == ["id", "custom_id", "response", "error", "pagedserve"]
        assert record["id"].startswith("batch_req_") and len(record["id"]) == 42
    assert len({record["id"] for record in records.values()}) == 4
    ok = records["r1"]
    assert ok["error"] is None and ok["pagedserve"] == {"attempts": 1, "endpoint": url}
    assert list(ok["response"]) == ["status_code", "request_id", "body"]
    assert ok["response"]["status_code"] == 200
    assert ok["response"]["request_id"].startswith("req-")
    assert ok["response"]["body"]["choices"][0]["text"] == " tok0 tok1"
    # An HTTP error is a response; `error` stays null.
    bad = records["bad"]
    assert bad["response"] == {"status_code": 400, "request_id": None, "body": {"error": {
        "message": "injected 400", "type": "injected_error", "code": "400"}}}
    assert bad["error"] is None
    assert bad["pagedserve"] == {"attempts": 1, "endpoint": url, "error_type": "BadRequestError"}
    assert server.arrivals_for("p0")[0].body["model"] == "fake-model"  # the server's first
    assert (summary.succeeded, summary.failed, summary.skipped) == (3, 1, 0)


async def test_resume_after_cancel_gives_exactly_one_result_per_id(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 40)
    server, url = await serve(delay=0.02)
    task = asyncio.create_task(run_batch_file(source, target, config(url, tokens=40), model="m"))
    while not target.exists() or target.read_bytes().count(b"\n") < 8:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    first_run = read_output(target)  # every line whole: each is one write
    assert 8 <= len(first_run) < 40
    summary = await run_batch_file(source, target, config(url, tokens=40), model="m")
    ids = [r["custom_id"] for r in read_output(target)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40))
    assert len(ids) == len(set(ids)) == 40
    assert summary.skipped == len(first_run)
    assert summary.succeeded == 40 - len(first_run)
    for record in first_run:  # finished before the cancel: never sent again
        assert len(server.arrivals_for("p" + record["custom_id"][1:])) == 1


async def test_resume_after_a_torn_line(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 4)
    ok = b'"response": {"status_code": 200, "request_id": null, "body": {}}, "error": null'
    target.write_bytes(b'{"custom_id": "r0", ' + ok + b'}\n'
                       b'{"custom_id": "r1", ' + ok + b'}\n'
                       b'{"custom_id": "r2", "resp')
    server, url = await serve()
    summary = await run_batch_file(source, target, config(url), model="m")
    ids = [r["custom_id"] for r in read_output(target)]
    assert ids[:2] == ["r0", "r1"] and sorted(ids[2:]) == ["r2", "r3"]
    assert summary.skipped == 2
    assert sorted(a.key for a in server.arrivals) == ["p2", "p3"]


async def test_rerun_retries_failed_lines_and_counts_the_unresolved(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 4)
    down = [("status", 503, {}, "engine_dead")]
    server, url = await serve(script={"p1": down, "p2": [("status", 400)] * 2})
    first = await run_batch_file(source, target, config(url), model="m")
    # engine_dead cannot succeed by retrying the endpoint: one attempt, not max_attempts.
    assert len(server.arrivals_for("p1")) == 1
    assert (first.succeeded, first.failed, first.unresolved) == (2, 2, 2)
    assert first.describe().endswith("; 2 of 4 items have no successful result "
                                     "(rerun to retry them)")
    dead = {r["custom_id"]: r for r in read_output(target)}["r1"]
    assert dead["response"]["status_code"] == 503 and dead["error"] is None

    kept = await run_batch_file(source, target, config(url), model="m", retry_failed=False)
    assert (kept.submitted, kept.skipped, kept.previously_failed, kept.unresolved) == (0, 4, 2, 2)
    assert len(server.arrivals) == 4

    second = await run_batch_file(source, target, config(url), model="m")
    assert (second.succeeded, second.failed, second.skipped, second.unresolved) == (1, 1, 2, 1)
    records = read_output(target)
    assert sorted(r["custom_id"] for r in records) == ["r0", "r1", "r2", "r3"]
    by_id = {r["custom_id"]: r for r in records}
    assert by_id["r1"]["response"]["status_code"] == 200
    assert by_id["r2"]["response"]["status_code"] == 400
    assert [len(server.arrivals_for(f"p{i}")) for i in range(4)] == [1, 2, 2, 1]

    third = await run_batch_file(source, target, config(url), model="m")
    assert (third.succeeded, third.unresolved) == (1, 0)
    assert all(r["response"]["status_code"] == 200 for r in read_output(target))


async def test_rerun_reads_results_from_an_openai_batch_file(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 3)
    openai_lines = [
        {"id": "batch_req_1", "custom_id": "r0", "error": None, "response": {
            "status_code": 200, "request_id": "abc", "body": {"choices": []}}},
        {"id": "batch_req_2", "custom_id": "r1", "response": None,
         "error": {"code": "batch_expired", "message": "expired"}},
    ]
    target.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in openai_lines))
    server, url = await serve()
    summary = await run_batch_file(source, target, config(url), model="m")
    assert (summary.succeeded, summary.skipped, summary.unresolved) == (2, 1, 0)
    assert sorted(a.key for a in server.arrivals) == ["p1", "p2"]
    assert read_output(target)[0] == openai_lines[0]  # untouched
