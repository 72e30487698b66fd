"""view-run and view-run-multimodal in a real browser, against a real run-api.

Both tools run as subprocesses, each started once for the module (a start imports
Gradio: about 8 s of CPU); headless chromium (Debian's, through Playwright) clicks the
page's button and reads what it shows. The view-run page is pointed at one port, where
each test puts the API it asks about: none, one that wants a token, a plain one. It binds
0.0.0.0 with --insecure, so it also answers the exposure question for --insecure; the
multimodal page keeps the default host. The module ends by stopping both with Ctrl-C.
Set ATROPOS_VIEW_RUN_SCREENSHOT=PATH to save the page with its groups
(docs/images/view-run.png is made this way).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atroposlib.utils.ports import free_port
from atroposlib.viewer.settings import PAGE_KEY_ENV
from tests.support.groups import register_env
from tests.support.processes import ApiProcess
from tests.support.text_groups import png_base64, text_group
from tests.support.viewer import ViewerProcess

pytestmark = pytest.mark.timeout(300)

BUTTON = "Grab next batch"
PAGE_TIMEOUT_MS = 30_000
QUESTIONS = [f"What is {a} + {b} mod 10?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)] * 2]


@pytest.fixture(scope="module")
def api_port() -> int:
    """Where both pages look for run-api; each test starts there the API it needs."""
    return free_port()


@pytest.fixture(scope="module")
def api_url(api_port) -> str:
    return f"http://127.0.0.1:{api_port}"


@pytest.fixture
def api_at(api_port, tmp_path) -> Iterator:
    """`api_at(*flags)`: a fresh run-api on the pages' port, stopped after the test."""
    started: list[ApiProcess] = []

    def start(*flags: str) -> ApiProcess:
        api = ApiProcess(tmp_path / f"state{len(started)}", *flags, port=api_port)
        started.append(api)
        return api.start()

    yield start
    for api in started:
        api.stop()


def _viewer(log_dir: Path, module: str, *args: str) -> Iterator[ViewerProcess]:
    viewer = ViewerProcess(log_dir, module, *args, env={PAGE_KEY_ENV: ""})
    try:
        yield viewer.wait_ready()
    finally:
        viewer.stop()


@pytest.fixture(scope="module")
def view_run(tmp_path_factory, tiny_model_path, api_url) -> Iterator[ViewerProcess]:
    args = ("--api-url", api_url, "--tokenizer", str(tiny_model_path), "--group-size", "2")
    log_dir = tmp_path_factory.mktemp("view-run")
    yield from _viewer(log_dir, "view_run", *args, "--host", "0.0.0.0", "--insecure")


@pytest.fixture(scope="module")
def view_run_multimodal(tmp_path_factory, tiny_model_path, api_url) -> Iterator[ViewerProcess]:
    args = ("--api-url", api_url, "--tokenizer", str(tiny_model_path), "--group-size", "1")
    yield from _viewer(tmp_path_factory.mktemp("view-run-multimodal"), "view_run_multimodal", *args)


def _open(chromium, url: str):
    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    page.goto(url)
    return page


def _click_and_expect(page, text: str) -> None:
    from playwright.sync_api import expect

    page.get_by_role("button", name=BUTTON).click()
    expect(page.locator("#view-status")).to_contain_text(text, timeout=PAGE_TIMEOUT_MS)


def _post_as_env(api_url: str, groups: list[dict]) -> None:
    """Register an env (the viewer started the run) and post its groups, as `serve` does."""
    with httpx.Client(base_url=api_url, timeout=30) as client:
        env_id = register_env(client, group_size=len(groups[0]["tokens"]))["env_id"]
        response = client.post(
            "/scored_data_list", json=[{**group, "env_id": env_id} for group in groups]
        )
        assert response.status_code == 200, response.text


def test_unreachable_api_is_said_plainly(view_run, chromium, api_url):
    page = _open(chromium, view_run.url)
    _click_and_expect(page, f"Cannot reach the trajectory API at {api_url}: is run-api running?")
    page.close()


def test_insecure_serves_the_page_to_anyone(view_run):
    """On 0.0.0.0 with --insecure, the page answers a client that has no token."""
    page = httpx.get(view_run.url, timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_api_that_wants_a_token_is_said_plainly(api_at, view_run, chromium):
    api_at("--api-key", "s3cret")
    page = _open(chromium, view_run.url)
    _click_and_expect(page, "wants a token: set ATROPOS_API_KEY")
    page.close()


def test_view_run_shows_each_groups_prompt_completions_and_scores(
    api_at, view_run, chromium, tokenizer
):
    from playwright.sync_api import expect

    api = api_at()
    page = _open(chromium, view_run.url)
    # the viewer registers on the first click; nothing is queued yet
    _click_and_expect(page, "No batch yet: the environments are still producing the first")
    expect(page.locator("#view-status")).to_contain_text("a batch needs 16 sequences")

    groups = [
        text_group(
            tokenizer,
            question,
            [f" Answer A{i}", f" Answer B{i}"],
            [round(0.25 * i, 2), round(-0.5 * i, 2)],
        )
        for i, question in enumerate(QUESTIONS, start=1)
    ]
    _post_as_env(api.url, groups)  # 8 groups of 2: one batch of group_size * 8
    _click_and_expect(page, "Batch 1 from")

    shown = page.locator("#view-groups")
    expect(shown).to_contain_text("8 group(s), 16 sequence(s)", timeout=PAGE_TIMEOUT_MS)
    for i, question in enumerate(QUESTIONS, start=1):
        group = page.locator(f"#view-group-{i - 1}")
        expect(group.locator(".prompt")).to_contain_text(question)
        items = group.locator(".item")
        expect(items).to_have_count(2)
        expect(items.nth(0)).to_contain_text(f"Answer A{i}")
        expect(items.nth(0)).to_contain_text(f"score {0.25 * i:.4g}")
        expect(items.nth(1)).to_contain_text(f"Answer B{i}")
        expect(items.nth(1)).to_contain_text(f"score {-0.5 * i:.4g}")
        # the score colour of the static viewer: best green, worst red
        assert "rgb(" in items.nth(0).evaluate("e => getComputedStyle(e).backgroundColor")
        assert items.nth(0).get_attribute("class") == "item reward-positive"
        assert items.nth(1).get_attribute("class") == "item reward-negative"
    assert page.locator(".prompt", has_text=QUESTIONS[0]).count() == 2  # once per group
    screenshot = os.environ.get("ATROPOS_VIEW_RUN_SCREENSHOT")
    if screenshot:
        page.set_viewport_size({"width": 1000, "height": 760})
        page.screenshot(path=screenshot)

    # the batch was taken off the queue; the next click says so and keeps the groups shown
    _click_and_expect(page, "No batch yet")
    expect(shown).to_contain_text("Answer A8")

    page.close()


def test_view_run_multimodal_shows_the_images(api_at, view_run_multimodal, chromium, tokenizer):
    from playwright.sync_api import expect

    api = api_at()
    page = _open(chromium, view_run_multimodal.url)
    _click_and_expect(page, "No batch yet")
    image = png_base64((20, 160, 40), size=12)
    groups = [
        text_group(
            tokenizer, f"Describe picture {i}", [f" green square {i}"], [1.0], images=[image]
        )
        for i in range(8)
    ]
    _post_as_env(api.url, groups)
    _click_and_expect(page, "Batch 1 from")
    first = page.locator("#view-group-0")
    expect(first).to_contain_text("Describe picture 0")
    expect(first).to_contain_text("green square 0")
    picture = first.locator(".images img")
    expect(picture).to_have_count(1)
    # the browser decoded the base64 PNG: its natural size is the generated one
    assert picture.evaluate("img => img.complete && img.naturalWidth") == 12
    page.close()


@pytest.mark.integration  # the page's fixture is asked for by name, so say it
@pytest.mark.parametrize(
    ("module", "tool"),
    [("view_run", "view-run"), ("view_run_multimodal", "view-run-multimodal")],
)
def test_ctrl_c_stops_view_run_with_one_line(request, module, tool):
    """Ctrl-C, as a terminal sends it, to a page that served the tests above: one line,
    exit code 0, no traceback. (Last in the module: it ends the module's viewers.)"""
    viewer: ViewerProcess = request.getfixturevalue(module)
    viewer.proc.send_signal(signal.SIGINT)
    assert viewer.proc.wait(30) == 0
    log = viewer.log()
    assert "Traceback" not in log and log.rstrip().endswith(f"{tool}: stopped"), log
