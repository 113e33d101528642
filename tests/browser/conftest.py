"""Fixtures of the browser tests: headless Chromium from Debian's packages (``chromium``,
``chromium-driver``; ``deploy/browser.sh`` installs them) driven by Selenium, and a migrated
database with pgvector (so recall shows vector scores). Without the browser a test skips,
except with ``CI=true``, where it fails. Screenshots go to ``SCREENSHOTS_DIR`` when set
(``make screenshots``: ``docs/images``), else to the test's own directory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import servers
from tests.recall.conftest import vector_database_url  # noqa: F401 - a fixture, shared

CHROMIUM = ("/usr/bin/chromium", "chromium")
DRIVER = ("/usr/bin/chromedriver", "chromedriver")
WIDTH, HEIGHT = 1280, 900


def _which(names: tuple[str, ...]) -> str | None:
    for name in names:
        if (found := shutil.which(name)) is not None:
            return found
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Selenium's WebDriver), closed when the test ends."""
    chromium, driver = _which(CHROMIUM), _which(DRIVER)
    if chromium is None or driver is None:
        servers.unavailable("browser", "chromium and chromium-driver: run deploy/browser.sh")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # type: ignore[assignment]
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WIDTH},{HEIGHT}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(flag)
    web = webdriver.Chrome(service=Service(driver), options=options)
    web.set_page_load_timeout(60)
    try:
        yield web
    finally:
        web.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where
