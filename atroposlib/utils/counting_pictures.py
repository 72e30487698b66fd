"""Pictures of shapes on a grid, and questions that count them.

One generator for everything that draws them: the multimodal counting environment
(environments/multimodal_counting.py) and the tiny vision-language model's build
(atroposlib/utils/tiny_vlm.py), which must see the pictures the environment will send.

Each item is a PNG drawn with Pillow from a seed: 3-9 circles, squares and triangles in
red, green and blue, one per cell of a 4x4 grid (so none overlap), and a question.
`colour_shape` (the environment's default) asks for one colour and shape, such as "How
many red triangles are in the image?"; about one question in six has answer 0, and half
have answer 1. `total` asks how many shapes there are (3-9, evenly): the question the tiny
model is built for, because a model that does not look at the picture gets one in seven
right, and has nothing to gain from always giving the commonest answer.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any, Literal

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220)}
SHAPES = ("circle", "square", "triangle")
GRID, CELL = 4, 56  # a 224 x 224 canvas
QuestionKind = Literal["colour_shape", "total"]
TOTAL_QUESTION = "How many shapes are in the image?"
BARE_PROMPT = "Look at the image. Answer with one number."


def draw(shapes: list[tuple[str, str, int]]) -> bytes:
    """A PNG of (colour, shape, cell) triples on a white canvas."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (GRID * CELL, GRID * CELL), "white")
    pen = ImageDraw.Draw(image)
    for colour, shape, cell in shapes:
        x, y = (cell % GRID) * CELL + 8, (cell // GRID) * CELL + 8
        box = (x, y, x + CELL - 16, y + CELL - 16)
        fill = COLOURS[colour]
        if shape == "circle":
            pen.ellipse(box, fill=fill)
        elif shape == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(x + (CELL - 16) // 2, y), (box[2], box[3]), (x, box[3])], fill=fill)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_item(seed: int, kind: QuestionKind = "colour_shape") -> dict[str, Any]:
    """A picture (base64 PNG) and a question about it, with its count."""
    rng = random.Random(seed)
    cells = rng.sample(range(GRID * GRID), rng.randint(3, 9))
    shapes = [(rng.choice(list(COLOURS)), rng.choice(SHAPES), cell) for cell in cells]
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    if rng.random() > 0.2:  # usually ask about something that is there
        colour, shape, _ = rng.choice(shapes)
    if kind == "total":
        question, count = TOTAL_QUESTION, len(shapes)
    else:
        question = f"How many {colour} {shape}s are in the image?"
        count = sum(1 for c, s, _ in shapes if (c, s) == (colour, shape))
    return {
        "seed": seed,
        "question": question,
        "count": count,
        "image": base64.b64encode(draw(shapes)).decode(),
    }
