"""view-run and view-run-multimodal in a real browser, against a real run-api.

Both tools run as subprocesses; headless chromium (Debian's, through Playwright) clicks
the page's button and reads what it shows. Set ATROPOS_VIEW_RUN_SCREENSHOT=PATH to save
the page with its groups (docs/images/view-run.png is made this way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from atroposlib.utils.ports import free_port
from tests.support.browser import headless_chromium
from tests.support.groups import register_env
from tests.support.text_groups import png_base64, text_group
from tests.support.viewer import ViewerProcess

pytestmark = pytest.mark.timeout(300)

BUTTON = "Grab next batch"
PAGE_TIMEOUT_MS = 30_000
QUESTIONS = [f"What is {a} + {b} mod 10?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)] * 2]


@pytest.fixture(scope="module")
def chromium() -> Iterator:
    with headless_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def viewers(tmp_path) -> Iterator:
    started: list[ViewerProcess] = []

    def start(module: str, *args: str, env: dict | None = None) -> ViewerProcess:
        viewer = ViewerProcess(tmp_path, module, *args, env=env)
        started.append(viewer)
        return viewer.wait_ready()

    yield start
    for viewer in started:
        viewer.stop()


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


def test_view_run_shows_each_groups_prompt_completions_and_scores(
    api, viewers, chromium, tokenizer, tiny_model_path
):
    from playwright.sync_api import expect

    viewer = viewers(
        "view_run", "--api-url", api.url, "--tokenizer", str(tiny_model_path), "--group-size", "2"
    )
    page = _open(chromium, viewer.url)
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


def test_view_run_multimodal_shows_the_images(api, viewers, chromium, tokenizer, tiny_model_path):
    from playwright.sync_api import expect

    viewer = viewers(
        "view_run_multimodal",
        "--api-url",
        api.url,
        "--tokenizer",
        str(tiny_model_path),
        "--group-size",
        "1",
    )
    page = _open(chromium, viewer.url)
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


def test_unreachable_api_is_said_plainly(viewers, chromium, tiny_model_path):
    nowhere = f"http://127.0.0.1:{free_port()}"
    viewer = viewers("view_run", "--api-url", nowhere, "--tokenizer", str(tiny_model_path))
    page = _open(chromium, viewer.url)
    _click_and_expect(page, f"Cannot reach the trajectory API at {nowhere}: is run-api running?")
    page.close()


def test_api_that_wants_a_token_is_said_plainly(api_factory, viewers, chromium, tiny_model_path):
    api = api_factory("--api-key", "s3cret")
    viewer = viewers("view_run", "--api-url", api.url, "--tokenizer", str(tiny_model_path))
    page = _open(chromium, viewer.url)
    _click_and_expect(page, "wants a token: set ATROPOS_API_KEY")
    page.close()
