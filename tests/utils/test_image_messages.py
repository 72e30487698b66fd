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
