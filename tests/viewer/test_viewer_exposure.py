"""`view-run` and `view-run-multimodal` on a non-loopback address: refused without a token,
guarded with one (Bearer header for scripts, `?token=` once then a cookie for browsers).

The refusals run the real commands and need neither Gradio nor a tokenizer (the check
comes first); the guarded pages bind 0.0.0.0, are reached on 127.0.0.1, and are started
once per tool for the module (a start imports Gradio: about 8 s of CPU), so the script's
and the browser's questions go to the same page. `--insecure` is asked of the browser
tests' view-run page (test_view_run_browser.py), which binds 0.0.0.0 with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from atroposlib.utils.ports import free_port
from atroposlib.viewer.settings import PAGE_KEY_ENV, ViewRunSettings
from tests.support.browser import require_chromium
from tests.support.viewer import ViewerProcess
from tests.support.waiting import wait_until

TOOLS = ["view_run", "view_run_multimodal"]
TOKEN = "page-s3cret"


def refused_run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != PAGE_KEY_ENV}
    return subprocess.run(
        [sys.executable, "-m", f"atroposlib.cli.{module}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.integration
@pytest.mark.parametrize("module", TOOLS)
def test_non_loopback_without_a_token_is_refused(module, tmp_path):
    done = refused_run(module, "--host", "0.0.0.0", "--tokenizer", str(tmp_path / "none"))
    assert done.returncode == 2, done.stderr
    assert "refusing to bind 0.0.0.0 without an API key" in done.stderr
    assert "--insecure" in done.stderr and "--api-key" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_token_can_come_from_the_environment(monkeypatch):
    settings = ViewRunSettings(host="0.0.0.0")
    monkeypatch.delenv(PAGE_KEY_ENV, raising=False)
    assert settings.resolved().exposure_problem() is not None
    monkeypatch.setenv(PAGE_KEY_ENV, TOKEN)
    assert settings.resolved().api_key == TOKEN
    assert settings.resolved().exposure_problem() is None
    assert ViewRunSettings(host="0.0.0.0", insecure=True).exposure_problem() is None


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_model_path) -> Iterator:
    """`guarded(module)`: that tool on 0.0.0.0 with --api-key, against an API nobody
    serves, started on first use and kept for the module; up once /health answers."""
    pytest.importorskip("gradio")
    started: dict[str, ViewerProcess] = {}
    nowhere = f"http://127.0.0.1:{free_port()}"

    def start(module: str) -> ViewerProcess:
        if module not in started:
            started[module] = ViewerProcess(
                tmp_path_factory.mktemp(module),
                module,
                "--host",
                "0.0.0.0",
                "--tokenizer",
                str(tiny_model_path),
                "--api-url",
                nowhere,
                "--api-key",
                TOKEN,
                env={PAGE_KEY_ENV: ""},
            )
            viewer = started[module]
            wait_until(lambda: _healthy(viewer), 120, f"{module} did not answer /health")
        return started[module]

    yield start
    for viewer in started.values():
        viewer.stop()


def _healthy(viewer: ViewerProcess) -> bool:
    if viewer.proc.poll() is not None:
        raise AssertionError(f"the viewer exited early:\n{viewer.log()}")
    try:
        return httpx.get(f"{viewer.url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("module", TOOLS)
def test_a_token_guards_the_page_and_gradios_api(guarded, module):
    viewer = guarded(module)
    with httpx.Client(base_url=viewer.url, timeout=30) as anyone:
        for path in ("/", "/config", "/gradio_api/info"):
            assert anyone.get(path).status_code == 401, path
        call = anyone.post("/gradio_api/call/get_batch", json={"data": []})
        assert call.status_code == 401
        assert anyone.get("/?token=wrong").status_code == 401
        posted = anyone.post(f"/gradio_api/call/get_batch?token={TOKEN}", json={"data": []})
        assert posted.status_code == 401, "the query token only opens a GET (then a cookie)"
        assert anyone.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401

    forged = {f"atropos_view_{viewer.port}": TOKEN}  # the token itself is not the cookie
    with httpx.Client(base_url=viewer.url, timeout=30, cookies=forged) as guesser:
        assert guesser.get("/").status_code == 401

    with httpx.Client(base_url=viewer.url, timeout=30) as script:
        page = script.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert page.status_code == 200 and "<html" in page.text.lower()

    with httpx.Client(base_url=viewer.url, timeout=60) as browser:
        entry = browser.get("/?token=" + TOKEN, follow_redirects=False)
        assert entry.status_code == 303 and entry.headers["location"] == "/"
        assert TOKEN not in entry.headers["set-cookie"], "the cookie must not hold the token"
        assert "httponly" in entry.headers["set-cookie"].lower()
        assert browser.get("/").status_code == 200
        assert_button_click_answers(browser)


def assert_button_click_answers(browser: httpx.Client) -> None:
    """What the page's button does, through Gradio's API with the cookie alone."""
    event = browser.post("/gradio_api/call/get_batch", json={"data": []})
    assert event.status_code == 200, event.text
    event_id = event.json()["event_id"]
    stream = browser.get(f"/gradio_api/call/get_batch/{event_id}")
    assert stream.status_code == 200
    assert "Cannot reach the trajectory API" in stream.text


@pytest.mark.e2e  # a real browser
def test_a_browser_gets_in_with_the_token_once(guarded):
    """Chromium opens /?token= once; the page's own requests then carry only the cookie."""
    path = require_chromium()
    from playwright.sync_api import expect, sync_playwright

    viewer = guarded("view_run")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        try:
            stranger = browser.new_page()
            assert stranger.goto(viewer.url).status == 401
            page = browser.new_page()
            page.goto(f"{viewer.url}/?token={TOKEN}")
            assert page.url == f"{viewer.url}/", "the token leaves the address bar"
            page.get_by_role("button", name="Grab next batch").click()
            expect(page.locator("#view-status")).to_contain_text(
                "Cannot reach the trajectory API", timeout=30_000
            )
        finally:
            browser.close()
