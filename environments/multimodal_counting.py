"""Counting shapes in a generated picture: a multimodal environment.

Task: each item is a PNG drawn with Pillow from a seed (3-9 circles, squares and
triangles in red, green and blue, one per cell of a 4x4 grid, so none overlap) and a
question such as "How many red triangles are in the image?". Items are generated, so
there is no dataset to download.

The image goes to the model in OpenAI's image message format (a text part and an
`image_url` part holding a `data:image/png;base64,...` URL), which vLLM serves for
vision-language models, and into the group's `images` field (one base64 PNG per
sequence, as upstream's multimodal environments send it). Sampling is a plain
`chat_completion`, not ManagedServer: the trainer-side tokens are the conversation's
text rendered with the env tokenizer's chat template, the image part standing in as
the placeholder text `<image>` (the VLM's own image tokens are the trainer's
processor's business). The prompt is masked, the reply trained on.

Reward (`answer_tag`): 1.0 when the one `<answer>N</answer>` after any thinking is the
count; a count only inside `<think>`, several answers, an empty reply or an over-long
answer score 0.

    python environments/multimodal_counting.py process --env.total_steps 4 \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name Qwen/Qwen2.5-VL-3B-Instruct

That needs a vision-language model (vLLM serving Qwen2.5-VL, say). Offline, the tiny
model (environments/README.md serves it) reads text only (`atropos-inference-server`
drops image parts), so it never sees the picture; the run checks the pipeline (drawing,
the image message, scoring, the groups with their images, the viewer), not the task; it
draws 8 training pictures instead of 5,000:

    python environments/multimodal_counting.py process --env.total_steps 2 \\
        --env.group_size 2 --env.train_size 8 --env.max_tokens 32 \\
        --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import base64
import io
import random
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.reward_fns import tagged_answer
from atroposlib.envs.reward_fns.answer_tag_reward import same_answer
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220)}
SHAPES = ("circle", "square", "triangle")
GRID, CELL = 4, 56  # a 224 x 224 canvas
IMAGE_PLACEHOLDER = "<image>"
SYSTEM_PROMPT = (
    "Look at the image. You may think inside <think></think>; then answer <answer>N</answer>."
)


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


def make_item(seed: int) -> dict[str, Any]:
    """A picture and a question about it; about one question in six has answer 0."""
    rng = random.Random(seed)
    cells = rng.sample(range(GRID * GRID), rng.randint(3, 9))
    shapes = [(rng.choice(list(COLOURS)), rng.choice(SHAPES), cell) for cell in cells]
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    if rng.random() > 0.2:  # usually ask about something that is there
        colour, shape, _ = rng.choice(shapes)
    return {
        "seed": seed,
        "question": f"How many {colour} {shape}s are in the image?",
        "count": sum(1 for c, s, _ in shapes if (c, s) == (colour, shape)),
        "image": base64.b64encode(draw(shapes)).decode(),
    }


def count_score(completion: str, count: int) -> float:
    return float(same_answer(tagged_answer(completion), count))


def text_only(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The conversation as text: image parts become the placeholder."""
    flat = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = "\n".join(
                part["text"] if part["type"] == "text" else IMAGE_PLACEHOLDER for part in content
            )
        flat.append({"role": message["role"], "content": content})
    return flat


class MultimodalCountingConfig(SingleTurnConfig):
    """Single-turn settings; items are generated from `seed`."""

    train_size: int = Field(5000, ge=1, description="Generated training pictures.")


class MultimodalCountingEnv(SingleTurnEnv):
    name = "multimodal_counting"
    env_config_cls = MultimodalCountingConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-VL-3B-Instruct",
        "group_size": 8,
        "max_token_length": 2048,
        "max_tokens": 512,
        "eval_size": 100,
    }
    server_defaults = {"server_type": "openai"}

    async def setup(self) -> None:
        first = self.config.seed * 1_000_000
        self.train_items = [make_item(first + i) for i in range(self.config.train_size)]
        self.eval_items = [make_item(-1 - i) for i in range(self.config.eval_size)]

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        image = {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{item['image']}"},
        }
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": [{"type": "text", "text": item["question"]}, image]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        return count_score(completion, item["count"])

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"seed": item["seed"], "question": item["question"], "gold": item["count"]}

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list]:
        messages = self.messages_for(item)
        chat = await self.server.chat_completion(
            messages=messages,
            n=self.config.group_size,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "messages": []}
        for choice in chat.choices:
            reply = choice.message.content or ""
            conversation = [*text_only(messages), {"role": "assistant", "content": reply}]
            tokenized = tokenize_for_trainer(
                self.tokenizer, conversation, finish_reason=choice.finish_reason or ""
            )
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(self.score(reply, item))
            group["messages"].append(conversation)
        group["images"] = [item["image"]] * len(chat.choices)
        return group, []


if __name__ == "__main__":
    MultimodalCountingEnv.cli()
