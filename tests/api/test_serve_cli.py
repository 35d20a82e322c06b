"""``pagedserve serve`` as vLLM's ``vllm serve``: the model as a positional argument, flags
with vLLM's names, help and defaults, ``--device auto``, ``--version``, and the startup log."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

from pagedserve.cli import generate, main, serve
from pagedserve.server.api import ServerConfig
from pagedserve.server.api.http.limits import ServerLimits
from pagedserve.server.engine.config.engine_args import PREFAULT_ENV, EngineArgs, resolve_device
from pagedserve.server.models.model_config import ModelConfig


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


def test_tenant_flags_reach_the_scheduler_config() -> None:
    engine = serve.config_from_args(parse([
        "--max-num-batched-tokens", "256", "--max-shared-prefill-tokens", "24",
        "--tenant-linger-seconds", "0.5"])).engine_args
    config = engine.scheduler_config(max_model_len=256)
    assert (config.max_shared_prefill_tokens, config.tenant_linger_seconds) == (24, 0.5)
    default = serve.config_from_args(parse(["--max-num-batched-tokens", "256"])).engine_args
    assert default.scheduler_config(max_model_len=256).max_shared_prefill_tokens == 16
    with pytest.raises(SystemExit):
        parse(["--tenant-linger-steps", "4"])  # replaced by --tenant-linger-seconds


def test_limit_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    config = serve.config_from_args(parse([
        "--max-prompts-per-request", "8", "--max-completions-per-request", "16",
        "--tokenizer-threads", "3", "--timeout-keep-alive", "7.5",
        "--timeout-header-read", "2", "--max-connections", "100",
        "--max-connections-per-client", "10", "--max-requests-per-client", "5",
        "--max-tokens-per-request", "1000",
    ]))
    assert config.limits == ServerLimits(
        max_prompts_per_request=8, max_completions_per_request=16, tokenizer_threads=3,
        timeout_keep_alive=7.5, timeout_header_read=2.0, max_connections=100,
        max_connections_per_client=10, max_requests_per_client=5, max_tokens_per_request=1000)
    assert serve.config_from_args(parse([])).limits == ServerLimits()


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    config = serve.config_from_args(parse([]))
    # The CLI serves the real default model; EngineArgs() (the library's) stays on "tiny".
    assert config == ServerConfig(engine_args=EngineArgs(model="smollm2"), host="0.0.0.0",
                                  port=8000)


def test_several_api_keys_and_a_health_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    config = serve.config_from_args(parse(["--api-key", "a", "b", "--health-port", "9001",
                                           "--allow-special-tokens-in-content"]))
    assert (config.api_key, config.health_port) == (["a", "b"], 9001)
    assert config.allow_special_tokens_in_content
    defaults = serve.config_from_args(parse([]))
    assert (defaults.health_port, defaults.allow_special_tokens_in_content) == (None, False)


def test_trusted_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    config = serve.config_from_args(parse(["--forwarded-allow-ips", "10.0.0.0/8, ::1,*",
                                           "--forwarded-header", "forwarded"]))
    assert (config.forwarded_allow_ips, config.forwarded_header) == (
        ["10.0.0.0/8", "::1", "*"], "forwarded")
    defaults = serve.config_from_args(parse([]))
    assert (defaults.forwarded_allow_ips, defaults.forwarded_header) == ([], "x-forwarded-for")
    assert not defaults.trusted_proxies()


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    assert serve.config_from_args(parse([])).api_key == "from-env"
    monkeypatch.setenv(serve.API_KEY_ENV, "tenant-a, tenant-b,")  # each key a tenant
    assert serve.config_from_args(parse([])).api_key == ["tenant-a", "tenant-b"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "70000"], "port must be in [0, 65535], got 70000"),
        (["--max-request-body-bytes", "0"], "max_request_body_bytes must be at least 1, got 0"),
        (["--drain-timeout", "-1"], "drain_timeout must be non-negative, got -1.0"),
        (["--api-key", ""], "api_key must be non-empty when given"),
        (["--api-key", "a", ""], "api_key must be non-empty when given"),
        (["--health-port", "70000"], "health_port must be in [0, 65535], got 70000"),
        (["--max-connections", "0"], "max_connections must be positive, got 0"),
        (["--forwarded-allow-ips", "proxy.local"], "forwarded_allow_ips: 'proxy.local' is not "
                                                   "an IP address, a network (CIDR) or '*'"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be in (0, 1], got 1.5"),
        (["a", "--model", "b"], "two models given: 'a' and --model 'b'; give one"),
    ],
)
def test_bad_server_flags(argv: list[str], message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        serve.config_from_args(parse(argv))
    assert serve.run(parse(argv)) == 2
    assert capsys.readouterr().err == f"pagedserve serve: {message}\n"


def test_unloadable_model_exits_1_with_the_reason(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert serve.run(parse(["--model", str(missing), "--port", "0"])) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pagedserve serve: cannot start the engine: model '{missing}' ")


def test_model_as_positional_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    assert serve.config_from_args(parse(["/models/x", "--port", "1"])).engine_args.model == (
        "/models/x")
    assert serve.config_from_args(parse(["--model", "/models/y"])).engine_args.model == (
        "/models/y")
    # The same model both ways is not a conflict.
    assert serve.config_from_args(parse(["/m", "--model", "/m"])).engine_args.model == "/m"


@pytest.mark.parametrize("add_arguments", [serve.add_arguments, generate.add_arguments])
def test_every_option_has_help_and_shows_its_default(
        add_arguments: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option: nothing wraps mid-phrase
    parser = argparse.ArgumentParser(prog="pagedserve x")
    add_arguments(parser)
    text = parser.format_help()
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    for action in actions:
        assert action.help and action.help.strip(), action.dest
        line = next(line for line in text.splitlines() if action.help in line)
        assert line.endswith(f"(default: {action.default})"), line


def test_gpu_flags_have_vllm_names_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    defaults = serve.config_from_args(parse([])).engine_args
    assert (defaults.device, defaults.gpu_memory_utilization) == ("auto", 0.9)
    engine = serve.config_from_args(parse(["--device", "cpu", "--gpu-memory-utilization",
                                           "0.5"])).engine_args
    assert (engine.device, engine.gpu_memory_utilization) == ("cpu", 0.5)


def test_device_auto_picks_cuda_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device 'cuda' was asked for, but CUDA is not"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"pagedserve {main._version()}\n"


async def test_startup_log(model_dir: Path) -> None:
    """A real ``pagedserve serve MODEL`` process logs what it runs before it says it serves."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagedserve.cli.main", "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", "0", "--served-model-name", "tiny-test",
        "--num-kv-blocks", "48", "--max-num-seqs", "8", "--max-model-len", "512",
        "--dtype", "float32", "--disable-access-log", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", PREFAULT_ENV: "1"},  # the default
    )
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 120)).decode()
        assert line.startswith("pagedserve: serving on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    logged = [entry.split("pagedserve.serve: ", 1)[1] for entry in err.decode().splitlines()
              if "INFO pagedserve.serve: " in entry]
    num_bytes = 48 * ModelConfig.from_pretrained(model_dir).bytes_per_block(16, torch.float32)
    # Populated by a thread where Linux can (done by now, or not yet), else zeroed at start-up.
    prefaulted = re.fullmatch(r"KV cache prefault(ed: made resident at start-up in \d+\.\d\d s"
                              r"|: made resident in the background)", logged.pop(3))
    assert prefaulted is not None, logged
    assert logged[:6] == [
        f"model: {model_dir} ({model_dir}), served as tiny-test",
        "dtype: float32, device: cpu, kernels: torch",
        f"KV cache: 48 blocks of 16 tokens = 768 tokens of float32, {num_bytes:,} bytes "
        f"({num_bytes / 2**20:,.2f} MiB); CPU swap space: "
        f"{EngineArgs().cache_config().num_cpu_blocks(num_bytes // 48):,} blocks",
        "max_model_len: 512, max_num_seqs: 8, max_num_batched_tokens: 2,048",
        # 48 blocks, 32 per request of 512 tokens.
        "maximum concurrency for 512 tokens per request: 1.50x",
        f"listening on {url}",
    ]
    # The start-up heap (torch, the model, the engine) leaves the garbage collector's view.
    frozen = re.fullmatch(r"start-up heap frozen: (\d{1,3}(?:,\d{3})+) objects out of the garbage "
                          r"collector's view \((\d+\.\d\d) s\)", logged[6])
    assert frozen is not None, logged
    assert int(frozen[1].replace(",", "")) > 50_000


def test_help_never_shows_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "secret-from-env")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert "secret-from-env" not in parser.format_help()
    assert serve.config_from_args(parser.parse_args([])).api_key == "secret-from-env"
