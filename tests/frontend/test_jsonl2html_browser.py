"""The jsonl viewer's page in a real browser: a group's prompt is read once, not 4 times.

`generate_html` writes the page from a jsonl file as `process` does; headless chromium
(Debian's, through Playwright) opens it from disk and reads the rendered text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from atroposlib.frontend.jsonl2html import generate_html
from tests.support.browser import headless_chromium

pytestmark = pytest.mark.timeout(120)

CHAT_PROMPT = "Read the whole story before answering. " * 30 + "Who found the key?"
DECODED_PROMPT = (
    "<|im_start|>user\n" + "List the primes below fifty, one by one. " * 25 + "<|im_end|>\n"
    "<|im_start|>assistant\n"
)
CHAT_ANSWERS = ["The gardener found it.", "The cook did.", "Nobody found it.", "I cannot tell."]
DECODED_ANSWERS = ["2 3 5 7 11 13", "2, 3, 5, 7", "Primes: 2 and 3", "I am not sure."]


@pytest.fixture(scope="module")
def chromium() -> Iterator:
    with headless_chromium() as browser:
        yield browser


def _page_file(tmp_path: Path) -> Path:
    """Two groups of 4 samples: chat messages, and decoded tokens as BaseEnv writes them."""
    chat = {
        "scores": [1.0, 0.5, 0.0, -1.0],
        "messages": [
            [
                {"role": "system", "content": "Answer from the story only."},
                {"role": "user", "content": CHAT_PROMPT},
                {"role": "assistant", "content": answer},
            ]
            for answer in CHAT_ANSWERS
        ],
    }
    decoded = {
        "scores": [1.0, 0.25, 0.5, 0.0],
        "messages": [[{"role": "user", "content": DECODED_PROMPT + a}] for a in DECODED_ANSWERS],
    }
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(g) + "\n" for g in (chat, decoded)), encoding="utf-8")
    return generate_html(source)


def test_the_page_shows_each_groups_prompt_once_and_all_four_completions(chromium, tmp_path):
    from playwright.sync_api import expect

    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(_page_file(tmp_path).as_uri())

    text = page.inner_text("body")
    assert text.count(CHAT_PROMPT) == 1
    assert text.count(DECODED_PROMPT.strip()) == 1
    assert text.count("Answer from the story only.") == 1
    for index, answers in enumerate((CHAT_ANSWERS, DECODED_ANSWERS)):
        group = page.locator(f"#group-{index}")
        expect(group.locator(".shared-prompt")).to_have_count(1)
        expect(group.locator(".shared-prompt")).to_contain_text("Shared by all 4 samples:")
        items = group.locator(".item")
        expect(items).to_have_count(4)
        for position, answer in enumerate(answers):
            expect(items.nth(position)).to_contain_text(answer)
            expect(items.nth(position)).to_contain_text(f"#{position}")
            assert "Who found the key?" not in items.nth(position).inner_text()
            assert "primes below fifty" not in items.nth(position).inner_text()
        # the prompt is drawn above the completions
        prompt_box = group.locator(".shared-prompt").bounding_box()
        first_item = items.nth(0).bounding_box()
        assert prompt_box and first_item and prompt_box["y"] < first_item["y"]
    assert page.locator("#group-0 .item").nth(0).get_attribute("class") == "item reward-positive"
    assert requests == [page.url]  # self-contained: the page fetched nothing else
    page.close()
