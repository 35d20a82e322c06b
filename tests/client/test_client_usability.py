"""What a user meets first: type information (the mypy check of a user script is
tests/test_user_typing.py), the OpenAI SDK's environment variables, clear errors for a
misused config, the token budget explained in help(), a progress bar with ETA."""

from __future__ import annotations

import io
import pydoc
import sys
from pathlib import Path

import pytest

from pagedserve.client import (
    AsyncClient,
    BatchRequest,
    BatchRunner,
    PoolConfig,
    RetryPolicy,
    build_pool,
    run_batch,
)

ROOT = Path(__file__).resolve().parents[2]

def test_py_typed_and_the_sonnets_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["pagedserve"]
    assert (ROOT / "pagedserve" / "py.typed").is_file()
    assert "sonnets.txt" in package_data["pagedserve.loadgen"]
    assert (ROOT / "pagedserve" / "loadgen" / "sonnets.txt").is_file()
    assert "mypy>=1.10" in config["project"]["optional-dependencies"]["test"]


async def test_client_reads_the_openai_environment(serve, monkeypatch):
    server, url = await serve()
    monkeypatch.setenv("OPENAI_BASE_URL", url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    async with AsyncClient() as client:
        assert client.base_url == url
        await client.completions.create(model="m", prompt="x", max_tokens=1)
    async with AsyncClient(url, api_key="") as client:  # explicitly none
        await client.completions.create(model="m", prompt="x", max_tokens=1)
    assert server.auth_headers == ["Bearer sk-env", None]
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ValueError) as info:
        AsyncClient()
    assert str(info.value) == (
        "no base_url given and $OPENAI_BASE_URL is not set; pass the server's URL, "
        "e.g. AsyncClient('http://127.0.0.1:8000/v1')"
    )


def test_pool_config_refuses_a_single_string():
    with pytest.raises(TypeError) as info:
        PoolConfig(base_urls="http://h:8000")  # type: ignore[arg-type]
    assert str(info.value) == ("base_urls must be a list of URLs, got the string "
                               "'http://h:8000'; write base_urls=['http://h:8000']")


@pytest.mark.parametrize("target", [run_batch, PoolConfig])
def test_help_explains_the_token_budget(target):
    text = " ".join(pydoc.render_doc(target, renderer=pydoc.plaintext).split())
    assert "prompt tokens + n × max_tokens" in text
    assert "16 (OpenAI's default)" in text or "OpenAI's default of 16" in text
    assert "1024" in text and '"auto"' in text and "GET /load" in text


def test_readme_has_a_run_batch_example_with_the_budget():
    readme = (ROOT / "README.md").read_text()
    assert "run_batch(requests, config" in readme
    assert "prompt tokens + n × max_tokens" in readme


async def test_progress_bar_has_a_total_and_an_eta(serve, monkeypatch):
    _, url = await serve()
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    batch = [BatchRequest(f"i{k}", "completions", {"model": "m", "prompt": f"p{k}",
                                                   "max_tokens": 2}) for k in range(3)]
    config = PoolConfig([url], max_inflight_tokens=100, cooldown=RetryPolicy(jitter=0.0))
    async with await build_pool(config) as pool:
        await BatchRunner(pool, progress=True).run(batch)
    final = stderr.getvalue().split("\r")[-1]
    assert "3/3 [" in final and "<00:00" in final  # done/total [elapsed<remaining
