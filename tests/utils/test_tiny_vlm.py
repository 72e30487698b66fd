"""The tiny vision-language model's kit: what it saves reloads offline with transformers'
own auto classes, and its processor turns a counting picture into 16 image tokens.

A build with a few steps (the full build's figures are checked by the build itself and
measured by the CPU multimodal run): about 10 s of CPU."""

from __future__ import annotations

import base64
import io
import json

import pytest

from atroposlib.utils.counting_pictures import make_item
from atroposlib.utils.tiny_vlm import (
    TinyVlmSpec,
    VlmReading,
    check_counting,
    conversation,
    expected_greedy_accuracy,
)
from tests.support.vision import QUICK_VLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def built(quick_vlm_path):
    return quick_vlm_path


def test_a_quick_build_reloads_with_the_auto_classes_and_counts_its_image_tokens(built):
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(built)
    model = AutoModelForImageTextToText.from_pretrained(built)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    item = make_item(3, "total")
    text = processor.apply_chat_template(conversation(item), add_generation_prompt=True)
    picture = Image.open(io.BytesIO(base64.b64decode(item["image"]))).convert("RGB")
    inputs = processor(text=[text], images=[[picture]], return_tensors="pt")
    tokens = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    start = tokens.index("<fake_token_around_image>")
    assert tokens[start : start + 19] == [
        "<fake_token_around_image>",
        "<global-img>",
        *["<image>"] * 16,
        "<fake_token_around_image>",
    ]
    assert tokens.count("<image>") == 16 and tokens[-3:] == ["<|im_start|>", "assistant", "Ċ"]
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, len(tokens), len(processor.tokenizer))
    record = json.loads((built / "atropos_tiny_model.json").read_text())
    assert record["steps"] == 4 and record["spec"] == QUICK_VLM.model_dump()
    assert 0 <= record["reading"]["greedy_accuracy"] <= 1


def test_the_check_names_each_figure_off_its_mark():
    counts = [3, 4, 5, 6, 7, 8, 9]  # greedy is right on the odd ones: 4 in 7
    assert expected_greedy_accuracy(counts) == pytest.approx(4 / 7)
    good = VlmReading(p_right=0.31, greedy_accuracy=0.55, p_end_after_digit=0.99)
    assert check_counting(good, counts, TinyVlmSpec()) == []
    blind = VlmReading(p_right=0.14, greedy_accuracy=0.14, p_end_after_digit=0.5)
    problems = check_counting(blind, counts, TinyVlmSpec())
    assert [p.split(" is ")[0] for p in problems] == [
        "p(right)",
        "greedy accuracy",
        "p(<|im_end|> after the digit)",
    ]


def test_the_environments_image_parts_render_as_the_placeholder(built):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(built)
    item = make_item(3, "total")
    sent = conversation(item)
    sent[1]["content"][1] = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}
    rendered = processor.apply_chat_template(sent, add_generation_prompt=True)
    assert rendered == processor.apply_chat_template(conversation(item), add_generation_prompt=True)
    assert rendered.count("<image>") == 1


def test_the_cli_builds_the_vlm_with_vision_and_refuses_one_that_does_not_count(tmp_path, capsys):
    """`atropos-make-tiny-model --vision DIR` with the quick spec's flags: its few steps do
    not count, so it says so with the figures, exits 1 and writes nothing."""
    from atroposlib.cli.make_tiny_model import main

    out = tmp_path / "vl"
    quick = ["--pictures", "64", "--held-out", "16", "--batch-size", "8"]
    code = main(["--vision", str(out), *quick, "--read-steps", "2", "--max-steps", "2"])
    said = capsys.readouterr()
    assert code == 1 and not out.exists()
    assert "building the tiny VLM into" in said.out
    assert "the tiny VLM does not count after 4 steps: " in said.err and "greedy" in said.err
