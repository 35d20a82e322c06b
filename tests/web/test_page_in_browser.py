"""The web pages in a real browser (headless chromium), on the real default model behind an
API key: the page asks for the key once per tab, a chat message streams the model's answer,
and the KV block grid fills while long requests run (with blocks shared through the prefix
cache) and holds no block in use after them; the router's page lists its replicas. Where the
screenshots go: tests/web/browser.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import uvloop

from tests.api.live_server import LiveServer, server_config
from tests.api.test_smollm2 import ANSWER, QUESTION
from tests.smollm2 import smollm2_file
from tests.web.browser import chromium, save_screenshot, screenshot_dir, wait_for

KEY = "sk-page"
# Long enough to fill the grid for a few seconds; the shared part is several blocks long.
SYSTEM = "You are a patient teacher. " * 20
LONG_TOKENS = 32
DEAD = "http://127.0.0.1:9"  # nothing listens there


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@pytest.fixture(scope="module")
def screens() -> Path:
    return screenshot_dir()


@pytest.fixture(scope="module")
def smollm2_server() -> Iterator[LiveServer]:
    smollm2_file()  # skips without the wheel
    threads = torch.get_num_threads()
    # A small cache, so that a few requests fill a visible share of the grid; one thread,
    # as in tests/api/test_smollm2.py.
    engine = {"dtype": "float32", "max_model_len": 512, "cpu_threads": 1,
              "quantization": "none", "num_kv_blocks": 96, "enable_prefix_caching": True}
    config = replace(server_config("smollm2", engine=engine, api_key=KEY),
                     served_model_names=["smollm2"])
    live = LiveServer(config).start()
    yield live
    live.stop()
    torch.set_num_threads(threads)


@pytest.fixture
def page(browser: Any, smollm2_server: LiveServer) -> Any:
    """The page in a tab that already holds the key."""
    browser.get(smollm2_server.base_url + "/")
    browser.execute_script(f"sessionStorage.setItem('pagedserve.apiKey', '{KEY}')")
    browser.refresh()
    wait_for(lambda: by_id(browser, "model").get_attribute("value") == "smollm2",
             what="the model picker")
    return browser


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def grid_cells(driver: Any) -> str:
    return by_id(driver, "grid").get_attribute("data-cells") or ""


def set_field(driver: Any, element_id: str, value: str) -> None:
    field = by_id(driver, element_id)
    field.clear()
    field.send_keys(value)


def long_request(server: LiveServer) -> Any:
    from openai import OpenAI

    with OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0) as client:
        return client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=LONG_TOKENS,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "Tell me about the sea."}],
            extra_body={"ignore_eos": True})


def test_the_page_chats_and_shows_the_blocks(page: Any, smollm2_server: LiveServer,
                                             screens: Path) -> None:
    from openai import OpenAI

    browser = page
    idle_cells = wait_for(lambda: grid_cells(browser), what="the block grid")
    assert idle_cells == "0" * 96

    # A chat message streams the real model's answer; its stats line shows TTFT and tokens.
    set_field(browser, "temperature", "0")
    set_field(browser, "max-tokens", "30")
    set_field(browser, "prompt", QUESTION[0]["content"])
    by_id(browser, "send").click()
    answer = wait_for(lambda: browser.execute_script(
        "const a = document.querySelector('.message.assistant[data-finish-reason]');"
        "return a && {text: a.querySelector('.text').textContent, ...a.dataset,"
        "stats: a.querySelector('.stats').textContent};"), what="the answer")
    assert answer["text"] == ANSWER
    assert answer["finishReason"] == "stop"
    with OpenAI(base_url=smollm2_server.base_url + "/v1", api_key=KEY, max_retries=0) as api:
        usage = api.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=30).usage
    assert answer["tokens"] == str(usage.completion_tokens)
    assert float(answer["ttftMs"]) > 0
    assert answer["stats"].startswith("TTFT ") and f"{usage.completion_tokens} tokens" in \
        answer["stats"]

    # Two long requests with one system prompt: the second's prompt blocks are the first's
    # (a prefix-cache hit), so the grid shows shared blocks while both run.
    generated = smollm2_server.engine.stats().generation_tokens_total
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(long_request, smollm2_server)
        # Its prompt computed (and cached) before the second arrives.
        smollm2_server.wait_until(lambda s: s.num_running == 1
                                  and s.generation_tokens_total > generated, timeout=60)
        second = pool.submit(long_request, smollm2_server)
        busy = wait_for(lambda: "3" in (cells := grid_cells(browser)) and cells,
                        what="shared blocks")
        assert busy != idle_cells
        save_screenshot(browser, screens, "webui_shared_prefix")
        assert [f.result().usage.completion_tokens for f in (first, second)] == \
            [LONG_TOKENS, LONG_TOKENS]

    # After them no block is in use; the prompts' full blocks stay cached (evictable).
    after = wait_for(lambda: not {"2", "3"} & set(cells := grid_cells(browser)) and cells,
                     what="the blocks to be freed")
    assert "1" in after
    assert by_id(browser, "count-used").text == by_id(browser, "count-shared").text == "0"
    assert by_id(browser, "stat-running").text == "0"
    save_screenshot(browser, screens, "webui_after")


def test_the_page_asks_for_the_key_once_per_tab(browser: Any,
                                                smollm2_server: LiveServer) -> None:
    browser.get(smollm2_server.base_url + "/")
    browser.execute_script("sessionStorage.clear()")  # a new tab's storage
    browser.refresh()
    dialog = by_id(browser, "key-dialog")
    wait_for(lambda: dialog.get_attribute("open") is not None, what="the key dialog")
    set_field(browser, "key-input", "wrong")
    by_id(browser, "key-submit").click()
    wait_for(lambda: by_id(browser, "key-error").is_displayed(), what="the refusal")
    set_field(browser, "key-input", KEY)
    by_id(browser, "key-submit").click()
    wait_for(lambda: by_id(browser, "model").get_attribute("value") == "smollm2",
             what="the model list")
    wait_for(lambda: grid_cells(browser), what="the engine's state")
    stored = browser.execute_script("return sessionStorage.getItem('pagedserve.apiKey')")
    assert stored == KEY
    browser.refresh()  # the same tab keeps the key: no dialog, no request refused
    wait_for(lambda: by_id(browser, "model").get_attribute("value") == "smollm2",
             what="the model list after a reload")
    wait_for(lambda: grid_cells(browser), what="the engine's state after a reload")
    assert by_id(browser, "key-dialog").get_attribute("open") is None
    assert browser.execute_script(
        "return performance.getEntriesByType('resource')"
        ".filter(e => e.responseStatus === 401).length") == 0


@pytest.fixture(scope="module")
def router_url(smollm2_server: LiveServer) -> Iterator[str]:
    """``pagedserve router`` over the SmolLM2 server and an address where nothing listens,
    in a thread with its own event loop."""
    from aiohttp import web

    from pagedserve.router import RouterConfig, create_app, make_runner

    config = RouterConfig(replicas=[smollm2_server.base_url, DEAD], health_interval=0.5)
    runner = make_runner(create_app(config), access_log=None)
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


def test_the_router_page_lists_its_replicas(browser: Any, router_url: str,
                                            smollm2_server: LiveServer, screens: Path) -> None:
    browser.get(router_url + "/")
    rows = wait_for(lambda: browser.execute_script(
        "const rows = [...document.querySelectorAll('#replicas tbody tr')];"
        "return rows.length === 2 && rows.map(r => [...r.cells].map(c => c.textContent));"),
        what="the replica table")
    assert [row[:2] for row in rows] == [[smollm2_server.base_url, "healthy"],
                                         [DEAD, "ejected"]]
    save_screenshot(browser, screens, "router_page")
