"""The pure part of view-run: groups (token ids from a real tokenizer) to HTML, no Gradio."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from atroposlib.protocol import ScoredData
from atroposlib.viewer.render import (
    MASKED_ROLE,
    image_data_uri,
    prompt_length,
    render_batch,
    render_group,
    render_notice,
    scoped_css,
)
from tests.support.text_groups import MASKED, png_base64, text_group


def _items(page: str) -> list[str]:
    return re.findall(r'<div class="item[^"]*" style="background: [^"]*">.*?</div></div>', page)


def test_prompt_once_then_each_completion_with_its_score(tokenizer):
    group = text_group(
        tokenizer,
        "What is 3 + 4 mod 10?",
        [" The answer is 7", " The answer is 2", " I think 9"],
        [1.0, -1.0, 0.25],
    )
    page = render_group(ScoredData(**group), 0, tokenizer)
    assert page.count("What is 3 + 4 mod 10?") == 1
    items = _items(page)
    assert len(items) == 3
    for item, text, score in zip(
        items, ["The answer is 7", "The answer is 2", "I think 9"], ["1", "-1", "0.25"], strict=True
    ):
        assert text in item and f"score {score}<" in item
        assert "What is" not in item  # the prompt is not repeated per completion
    # colours from the jsonl viewer: best green, worst red, sign classes
    assert "hsl(120, 70%, 88%)" in items[0] and "reward-positive" in items[0]
    assert "hsl(0, 70%, 88%)" in items[1] and "reward-negative" in items[1]
    assert "mean 0.08333" in page and "min -1" in page and "max 1" in page


def test_shared_answer_words_stay_in_the_completions(tokenizer):
    """The prompt is the masked start, not the common text (which would eat 'The answer')."""
    group = text_group(tokenizer, "Q: 1 + 1?", [" The answer is 2", " The answer is 3"], [1, 0])
    prompt_part = re.search(
        r'<div class="prompt">.*?</div></div>', render_group(group, 0, tokenizer)
    )
    assert "The answer" not in prompt_part.group(0)
    assert all("The answer is" in item for item in _items(render_group(group, 0, tokenizer)))


def test_masked_tokens_inside_a_completion_are_labelled(tokenizer):
    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    prompt, call, tool, tail = ids("Tool call:"), ids(" search(x)"), ids(" RESULT ok"), ids(" done")
    group = {
        "tokens": [prompt + call + tool + tail],
        "masks": [[MASKED] * len(prompt) + call + [MASKED] * len(tool) + tail],
        "scores": [0.5],
    }
    page = render_group(group, 0, tokenizer)
    label = f"{MASKED_ROLE.capitalize()}:"
    assert page.count(label) == 1 and page.count("Trained:") == 2
    masked_part = page.split(label)[1].split("</div></div>")[0]
    assert "RESULT ok" in masked_part and "done" not in masked_part and "search" not in masked_part


def test_prompt_length_rules():
    assert prompt_length([[1, 2, 3], [1, 2, 4]], [[MASKED, MASKED, 3], [MASKED, MASKED, 4]]) == 2
    # masks say less than the shared start: masks win
    assert prompt_length([[1, 2, 3], [1, 2, 4]], [[MASKED, 2, 3], [MASKED, 2, 4]]) == 1
    # no masks: the common token prefix, but never the whole of a sequence
    assert prompt_length([[1, 2, 3], [1, 2, 4]], []) == 2
    assert prompt_length([[1, 2], [1, 2]], []) == 0
    assert prompt_length([[1, 2, 3]], []) == 0
    assert prompt_length([], []) == 0


def test_text_is_escaped(tokenizer):
    group = text_group(tokenizer, "Say <b>hi</b>", [" <script>alert(1)</script>"], [1.0])
    page = render_group(group, 0, tokenizer)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>" not in page


def test_mismatched_lengths_are_noted_not_raised(tokenizer):
    group = text_group(tokenizer, "P", [" a", " b", " c"], [1.0, 0.0, 0.5])
    group["scores"] = [1.0, 0.0]
    page = render_group(group, 3, tokenizer)
    assert "mismatched lengths: 3 token lists, 3 masks, 2 scores; showing the first 2" in page
    assert len(_items(page)) == 2


def test_undecodable_tokens_are_shown_as_a_note(tokenizer):
    page = render_group({"tokens": [[-5]], "masks": [[1]], "scores": [1.0]}, 0, tokenizer)
    assert "[1 tokens could not be decoded:" in page
    assert len(_items(page)) == 1


def test_images_shown_only_by_the_multimodal_view(tokenizer):
    png = png_base64()
    group = text_group(tokenizer, "Describe", [" red", " blue"], [1.0, 0.0], images=[png, png])
    plain = render_group(group, 0, tokenizer, show_images=False)
    assert "<img" not in plain and "1 image(s) attached: view-run-multimodal shows them" in plain
    multimodal = render_group(group, 0, tokenizer, show_images=True)
    assert multimodal.count("<img") == 1  # the same image twice is shown once
    assert f'src="data:image/png;base64,{png}"' in multimodal


def test_image_data_uri_accepts_base64_images_only():
    png = png_base64()
    assert image_data_uri(png) == f"data:image/png;base64,{png}"
    assert image_data_uri(f"data:image/png;base64,{png}") == f"data:image/png;base64,{png}"
    assert image_data_uri(
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    )
    assert image_data_uri("bm90IGFuIGltYWdl") is None  # base64 of "not an image"
    assert image_data_uri("%%%") is None
    assert image_data_uri("https://example.com/x.png") is None
    assert image_data_uri(None) is None


def test_unusable_images_are_counted(tokenizer):
    group = text_group(tokenizer, "D", [" x"], [1.0], images=["bm90IGFuIGltYWdl"])
    assert "1 image entry is not base64 PNG/JPEG/GIF/WebP" in render_group(
        group, 0, tokenizer, True
    )


def test_batch_and_notice(tokenizer):
    groups = [
        text_group(tokenizer, "A?", [" one", " two"], [1.0, 0.0], env_id=0),
        text_group(tokenizer, "B?", [" three", " four"], [0.0, 1.0], env_id=1),
    ]
    page = render_batch(groups, tokenizer)
    assert page.startswith('<div class="atropos-view">')
    assert "2 group(s), 4 sequence(s)" in page
    assert 'id="view-group-0"' in page and 'id="view-group-1"' in page
    assert "Prompt (env 1):" in page
    assert 'notice-error">No &lt;API&gt;' in render_notice("error", "No <API>")


def test_css_is_scoped_to_the_viewer():
    css = scoped_css()
    for line in css.splitlines():
        assert line.startswith(".atropos-view"), line
    assert ".atropos-view .reward-positive" in css


@pytest.mark.integration
def test_importing_the_viewer_and_its_tools_does_not_import_gradio():
    code = (
        "import sys; import atroposlib, atroposlib.cli.view_run, "
        "atroposlib.cli.view_run_multimodal, atroposlib.viewer.app, atroposlib.viewer.browse; "
        "assert 'gradio' not in sys.modules, 'gradio imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
