"""``pagedserve serve`` flags → ServerConfig (engine flags keep vLLM's names)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pagedserve.server.api import ServerConfig, ServerConfigError
from pagedserve.server.api.config import ServerLimits
from pagedserve.server.cli import serve


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_map_to_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    config = serve.config_from_args(parse([
        "--model", "/models/x", "--host", "127.0.0.1", "--port", "9000",
        "--served-model-name", "a", "b", "--api-key", "k", "--max-request-body-bytes", "1024",
        "--drain-timeout", "2.5", "--max-num-seqs", "8", "--max-waiting-requests", "4",
        "--enable-prefix-caching", "--block-size", "32",
    ]))
    assert (config.host, config.port, config.served_model_names) == ("127.0.0.1", 9000,
                                                                     ["a", "b"])
    assert (config.api_key, config.max_request_body_bytes, config.drain_timeout) == (
        "k", 1024, 2.5)
    engine = config.engine_args
    assert (engine.model, engine.max_num_seqs, engine.max_waiting_requests) == (
        "/models/x", 8, 4)
    assert (engine.enable_prefix_caching, engine.block_size) == (True, 32)


def test_limit_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    config = serve.config_from_args(parse([
        "--max-prompts-per-request", "8", "--max-completions-per-request", "16",
        "--tokenizer-threads", "3", "--timeout-keep-alive", "7.5",
        "--timeout-header-read", "2", "--max-connections", "100",
    ]))
    assert config.limits == ServerLimits(
        max_prompts_per_request=8, max_completions_per_request=16, tokenizer_threads=3,
        timeout_keep_alive=7.5, timeout_header_read=2.0, max_connections=100)
    assert serve.config_from_args(parse([])).limits == ServerLimits()


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    config = serve.config_from_args(parse([]))
    assert config == ServerConfig(host="0.0.0.0", port=8000)
    assert config.engine_args.model == "tiny"


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    assert serve.config_from_args(parse([])).api_key == "from-env"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "70000"], "port must be in [0, 65535], got 70000"),
        (["--max-request-body-bytes", "0"], "max_request_body_bytes must be at least 1, got 0"),
        (["--drain-timeout", "-1"], "drain_timeout must be non-negative, got -1.0"),
        (["--api-key", ""], "api_key must be non-empty when given"),
        (["--max-connections", "0"], "max_connections must be positive, got 0"),
    ],
)
def test_bad_server_flags(argv: list[str], message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ServerConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        serve.config_from_args(parse(argv))
    assert serve.run(parse(argv)) == 2
    assert capsys.readouterr().err == f"pagedserve serve: {message}\n"


def test_unloadable_model_exits_1_with_the_reason(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert serve.run(parse(["--model", str(missing), "--port", "0"])) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pagedserve serve: cannot start the engine: model '{missing}' ")
