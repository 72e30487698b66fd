"""Debian's chromium for browser tests, driven headless by Playwright.

`playwright install` downloads its own browsers, which cannot happen here or in CI, so
the tests launch the system chromium (scripts/test.sh installs it with apt). Its path is
$ATROPOS_CHROMIUM, else the first chromium on PATH. Without one the test skips with the
reason, except in CI (CI=true), where a missing browser must turn the run red.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM_ENV = "ATROPOS_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """The chromium executable to use, or None when this machine has none."""
    configured = os.environ.get(CHROMIUM_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The chromium path; skips the test without one (fails instead when CI is set)."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        _skip_unless_ci("playwright is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    if path is None:
        _skip_unless_ci(
            f"no chromium found (set {CHROMIUM_ENV} or install Debian's chromium: "
            "apt-get install -y chromium)"
        )
    return path


def _skip_unless_ci(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI must run the browser tests: {reason}")
    pytest.skip(reason)


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A headless Playwright browser on the system chromium (skips without one)."""
    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        try:
            yield browser
        finally:
            browser.close()
