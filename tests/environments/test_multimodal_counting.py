"""Multimodal counting: the picture reaches the model as an OpenAI image part, and the group
(its rows of the env table: tests/environments/test_env_table.py).

The scripted model counts the asked shapes in the PNG it was sent, by itself (colour
components, classified by how much of their bounding box they fill), so the test
checks the picture, the question and the env's scores against each other.
"""

from __future__ import annotations

import base64
import io
import re

from environments.multimodal_counting import (
    COLOURS,
    MultimodalCountingEnv,
    count_score,
    make_item,
)
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat

QUESTION = re.compile(r"How many (\w+) (\w+)s are in the image\?")


def count_in_png(png: bytes, colour: str, shape: str) -> int:
    """Connected blobs of exactly `colour`, kept when their fill ratio fits `shape`."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    pixels = image.load()
    target = COLOURS[colour]
    seen: set[tuple[int, int]] = set()
    fills = []
    for start in ((x, y) for y in range(height) for x in range(width)):
        if start in seen or pixels[start] != target:
            continue
        stack, blob = [start], []
        seen.add(start)
        while stack:
            x, y = stack.pop()
            blob.append((x, y))
            for near in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                inside = 0 <= near[0] < width and 0 <= near[1] < height
                if inside and near not in seen and pixels[near] == target:
                    seen.add(near)
                    stack.append(near)
        xs, ys = [p[0] for p in blob], [p[1] for p in blob]
        fills.append(len(blob) / ((max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1)))
    ranges = {"square": (0.95, 1.01), "circle": (0.7, 0.9), "triangle": (0.4, 0.65)}
    low, high = ranges[shape]
    return sum(low <= fill <= high for fill in fills)


def seen_count(messages) -> int:
    """What the scripted model counts in the picture it was sent."""
    text_part, image_part = messages[-1]["content"]
    colour, shape = QUESTION.search(text_part["text"]).groups()
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return count_in_png(base64.b64decode(url.split(",", 1)[1]), colour, shape)


def policy(messages, n):
    count = seen_count(messages)
    replies = [
        f"<think>I see {count}.</think><answer>{count}</answer>",
        f"<answer>{count + 1}</answer>",
        f"<think><answer>{count}</answer></think>",
        "",
    ]
    return replies[:n]


def test_the_independent_count_agrees_with_the_generator():
    for seed in range(30):
        item = make_item(seed)
        colour, shape = QUESTION.search(item["question"]).groups()
        png = base64.b64decode(item["image"])
        assert count_in_png(png, colour, shape) == item["count"], seed


def test_the_total_question_counts_every_shape_and_its_answers_are_spread():
    from collections import Counter

    from atroposlib.utils.counting_pictures import SHAPES, TOTAL_QUESTION

    for seed in range(3):
        item = make_item(seed, "total")
        png = base64.b64decode(item["image"])
        seen = sum(count_in_png(png, c, s) for c in COLOURS for s in SHAPES)
        assert item["question"] == TOTAL_QUESTION and seen == item["count"], seed
        assert item["image"] == make_item(seed)["image"]  # the same picture, another question
    answers = Counter(make_item(seed, "total")["count"] for seed in range(350))
    assert set(answers) == set(range(3, 10)) and min(answers.values()) > 0.08 * 350, answers


def test_bare_answers_score_the_last_integer():
    assert count_score("5", 5, "bare") == 1.0
    assert count_score("I count 4, no, 5", 5, "bare") == 1.0
    assert count_score("<answer>5</answer> 6", 5, "bare") == 0.0
    assert count_score("", 5, "bare") == 0.0


def test_scores_right_wrong_and_adversarial():
    assert count_score("<answer>2</answer>", 2) == 1.0
    assert count_score("<answer>3</answer>", 2) == 0.0
    assert count_score("<think><answer>2</answer></think>", 2) == 0.0
    assert count_score("<answer>2</answer><answer>3</answer>", 2) == 0.0
    assert count_score("", 2) == 0.0
    assert count_score("<answer>2</answer>" + "x" * 10000, 2) == 1.0  # only the tag is read


def check_process(groups: list[dict], run: Run) -> None:
    """The picture reached the model as an image part, and the group keeps it."""
    sent = [r["messages"][-1]["content"][1]["image_url"]["url"] for r in run.model.requests]
    for group in groups:
        assert len(group["images"]) == 4 and len(set(group["images"])) == 1
        assert f"data:image/png;base64,{group['images'][0]}" in sent
        assert all("<image>" in conversation[1]["content"] for conversation in group["messages"])


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/accuracy"] == 1.0
    assert all("image" not in s for s in samples)


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=MultimodalCountingEnv,
    model=chat(policy),
    group_size=4,
    steps=2,
    scores=lambda group: [1.0, 0.0, 0.0, 0.0],
    args=lambda run: [
        *("--env.max_tokens", "64", "--env.max_token_length", "512"),
        *("--env.train_size", "8"),  # not the default 5000 pictures: two groups need two
    ],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=MultimodalCountingEnv,
    model=chat(lambda messages, n: [f"<answer>{seen_count(messages)}</answer>"] * n),
    samples=10,
    args=lambda run: ["--env.eval_size", "10", "--env.train_size", "1"],
    check=check_evaluate,
)
