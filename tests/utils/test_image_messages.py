"""How chat messages carry pictures (atroposlib/utils/image_messages.py): the reading the
CPU engine, the counting environment and the trainer share. Pure functions, no model."""

from __future__ import annotations

import base64

import pytest

from atroposlib.utils.counting_pictures import make_item
from atroposlib.utils.image_messages import decode_picture, part_data, split_pictures


def image_part(data: str) -> dict:
    return {"type": "image_url", "image_url": {"url": data}}


def test_image_parts_become_the_templates_image_parts_in_order_and_text_stays():
    first, second = make_item(1)["image"], make_item(2)["image"]
    messages = [
        {"role": "system", "content": "Count."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "How many?"},
                image_part(f"data:image/png;base64,{first}"),
                {"type": "image", "image": second},
            ],
        },
    ]
    converted, pictures = split_pictures(messages)
    assert converted[0] == messages[0]
    assert converted[1]["content"] == [
        {"type": "text", "text": "How many?"},
        {"type": "image"},
        {"type": "image"},
    ]
    assert pictures == [f"data:image/png;base64,{first}", second]
    assert messages[1]["content"][1]["type"] == "image_url"  # the caller's list is untouched


def test_a_data_url_and_bare_base64_decode_to_the_same_rgb_picture():
    data = make_item(4)["image"]
    bare, url = decode_picture(data), decode_picture(f"data:image/png;base64,{data}")
    assert bare.mode == url.mode == "RGB"
    assert bare.size == url.size and bare.tobytes() == url.tobytes()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("https://example.com/cat.png", "nothing is fetched"),
        ("data:image/png;base64,not base64!", "not a base64 picture"),
        (base64.b64encode(b"plain text, not a PNG").decode(), "not a base64 picture"),
        ([["nested"]], "must be a base64 string, not list"),
    ],
)
def test_what_is_not_a_base64_picture_is_a_value_error_that_says_so(data, says):
    with pytest.raises(ValueError, match=says):
        decode_picture(data)


@pytest.mark.parametrize(
    "part",
    [{"type": "image_url"}, {"type": "image_url", "image_url": {"url": ""}}, {"type": "image"}],
)
def test_an_image_part_without_data_is_refused_by_its_type(part):
    with pytest.raises(ValueError, match=f"an {part['type']} part holds no image data"):
        part_data(part)


@pytest.mark.integration
def test_a_vlm_never_samples_a_pictures_placeholder(quick_vlm_path):
    """A reply holding `<image>` would be refused by the trainer (its image tokens no
    longer match its pictures): the CPU engine draws without the processor's picture
    tokens, even where they are the likeliest, greedy or sampled; its raw logprobs are
    the model's."""
    from types import SimpleNamespace

    import torch

    from atroposlib.inference.sampler import SamplingParams, TransformersSampler
    from atroposlib.utils.image_messages import picture_token_ids, vision_processor

    processor = vision_processor(str(quick_vlm_path))
    banned = picture_token_ids(processor)
    assert processor.tokenizer.convert_tokens_to_ids(processor.image_token) in banned
    logits = torch.zeros(3, len(processor.tokenizer))
    logits[:, banned] = 50.0  # the placeholders are by far the likeliest
    jobs = [SimpleNamespace(params=SamplingParams(temperature=t)) for t in (0.0, 1.0, 1.0)]
    rows = [(job, None) for job in jobs]
    draws = {id(job): torch.Generator().manual_seed(seed) for seed, job in enumerate(jobs)}
    engine = SimpleNamespace(unsampled_ids=banned, processed_logprobs=False)
    chosen, _ = TransformersSampler._choose(engine, logits, rows, [None] * 3, draws)
    assert not set(chosen) & set(banned)
    assert logits[0, banned[0]] == 50.0  # the row the raw logprobs come from is untouched
