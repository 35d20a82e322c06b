from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

import orjson
import pytest

from pagedserve.client import cli


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedserve batch")
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_arguments_become_configs():
    args = parse(["in.jsonl", "out.jsonl", "--base-url", "http://a:1,http://b:2",
                  "--base-url", "http://c:3/v1", "--max-inflight-tokens", "5000",
                  "--max-concurrency", "8", "--rpm", "600", "--tpm", "90000",
                  "--api-key", "sk-x", "--timeout", "30", "--token-counter", "server"])
    pool, options = cli.configs_from_args(args)
    assert pool.base_urls == ["http://a:1", "http://b:2", "http://c:3/v1"]
    assert (pool.max_inflight_tokens, pool.max_concurrency) == (5000, 8)
    assert (pool.requests_per_minute, pool.tokens_per_minute) == (600.0, 90000.0)
    assert (pool.api_key, pool.timeout.total) == ("sk-x", 30.0)
    assert options.counter == "server"
    assert parse(["i", "o", "--base-url", "http://a:1"]).max_inflight_tokens == "auto"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-inflight-tokens", "lots", "expected 'auto' or a positive integer, got 'lots'"),
        ("--max-concurrency", "0", "expected a positive integer, got '0'"),
        ("--rpm", "-1", "expected a positive number, got '-1'"),
    ],
)
def test_bad_arguments(flag, value, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse(["i", "o", "--base-url", "http://a:1", flag, value])
    assert info.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


async def _pagedserve(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagedserve.cli.main", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode, stderr.decode()


async def test_pagedserve_batch_end_to_end(serve, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 3}}
             for i in range(3)]
    source.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    server, url = await serve(script={"q2": [("status", 422)]})
    code, stderr = await _pagedserve("batch", str(source), str(target), "--base-url", url,
                                     "--model", "m", "--max-inflight-tokens", "100")
    assert code == 1, stderr
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith("2 succeeded, 1 failed, 0 skipped in ")
    assert summary.endswith("; errors: UnprocessableEntityError=1; 1 of 3 items have no "
                            "successful result (rerun to retry them)")
    records = {r["custom_id"]: r for r in map(orjson.loads, target.read_bytes().splitlines())}
    assert records["c0"]["response"]["body"]["choices"][0]["message"]["content"] == (
        " tok0 tok1 tok2"
    )
    assert records["c2"]["response"]["body"]["error"]["message"] == "injected 422"
    assert {a.body["model"] for a in server.arrivals} == {"m"}
    # Nothing new to send, but c2 still has no result: the rerun keeps the exit status 1.
    code, stderr = await _pagedserve("batch", str(source), str(target), "--base-url", url,
                                     "--model", "m", "--no-retry-failed")
    assert code == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith("0 succeeded, 0 failed, 3 skipped in ")
    # By default the rerun retries the failed line, which now succeeds.
    code, stderr = await _pagedserve("batch", str(source), str(target), "--base-url", url,
                                     "--model", "m")
    assert code == 0, stderr
    assert stderr.strip().splitlines()[-1].startswith("1 succeeded, 0 failed, 2 skipped in ")
    assert len(server.arrivals_for("q2")) == 2


def test_retry_failed_is_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--retry-failed, --no-retry-failed" in text
    assert "send again the items whose earlier result is a failure" in text


async def test_pagedserve_batch_rejects_bad_input(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    code, stderr = await _pagedserve("batch", str(source), str(tmp_path / "out.jsonl"),
                                     "--base-url", "http://127.0.0.1:9", "--model", "m")
    assert code == 2
    assert stderr == f"pagedserve batch: {source}:2: duplicate id 'a' (first on line 1)\n"
    assert not (tmp_path / "out.jsonl").exists()


def test_client_imports_neither_torch_nor_the_server():
    code = (
        "import sys, pagedserve.client, pagedserve.client.cli; "
        "print(sorted(m for m in sys.modules if m == 'torch' or "
        "m.startswith('pagedserve.server')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
