"""Debian's chromium, headless, driven by selenium through Debian's chromedriver (never a
downloaded browser), and where the tests' screenshots go.

Without the browser a test skips on a developer's machine and fails in CI ($CI set), where
.ci/run installs it. Screenshots go to $PAGEDSERVE_SCREENSHOTS if set (docs/images makes the
docs' pictures), else to a temporary folder; each saved path is printed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS_ENV = "PAGEDSERVE_SCREENSHOTS"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,860", "--hide-scrollbars")
INSTALL = "apt-get install -y chromium chromium-driver; pip install selenium"


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing"
    return None


def chromium() -> Iterator[Any]:
    """A headless chromium with a fresh profile; skips (fails in CI) without one."""
    missing = _missing()
    if missing is not None:
        message = f"no browser for the web page's tests: {missing} ({INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pagedserve-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot_dir() -> Path:
    chosen = os.environ.get(SCREENSHOTS_ENV)
    path = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="pagedserve-screens-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_screenshot(driver: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Polls ``predicate()`` until it returns something true; returns that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)
