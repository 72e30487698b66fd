"""Counting shapes in a generated picture: a multimodal environment.

Task: each item is a PNG drawn with Pillow from a seed (3-9 circles, squares and
triangles in red, green and blue, one per cell of a 4x4 grid, so none overlap) and a
question such as "How many red triangles are in the image?" (`--env.question_kind
total` asks how many shapes there are instead). Items are generated
(atroposlib/utils/counting_pictures.py), so there is no dataset to download.

The image goes to the model in OpenAI's image message format (a text part and an
`image_url` part holding a `data:image/png;base64,...` URL), which vLLM serves for
vision-language models, and into the group's `images` field (one base64 PNG per
sequence, as upstream's multimodal environments send it). Sampling is a plain
`chat_completion`, not ManagedServer. With a vision-language model's `tokenizer_name`,
the prompt's tokens are its processor's: its chat template renders the picture's
placeholder and the processor expands it into the picture's image tokens, as the engine
does (`atroposlib/utils/image_messages.py`); the reply's are the ids the engine sampled,
with their logprobs as `inference_logprobs` (`return_tokens_as_token_ids`, which vLLM
and the CPU engine answer), so the trainer's ratio and clipping see the sampling
policy. The trainer checks the image tokens against its own processor. With a text
tokenizer the image part stands in as the text `<image>`. The prompt is masked, the
reply trained on.

Reward (`answer_tag`): 1.0 when the one `<answer>N</answer>` after any thinking is the
count; a count only inside `<think>`, several answers, an empty reply or an over-long
answer score 0. `--env.answer_format bare` asks for the number alone and scores the
reply's last integer.

    python environments/multimodal_counting.py process --env.total_steps 4 \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name Qwen/Qwen2.5-VL-3B-Instruct

That needs a vision-language model (vLLM serving Qwen2.5-VL, say). Offline, the tiny
VLM does (`configs/multimodal_cpu.yaml` trains it under atropos-launch, which builds
`tiny-vl` and serves it on the CPU engine). A text model served by
`atropos-inference-server` drops image parts, so it never sees the picture; such a run
checks the pipeline (drawing, the image message, scoring, the groups with their images,
the viewer), not the task; it draws 8 training pictures instead of 5,000:

    python environments/multimodal_counting.py process --env.total_steps 2 \\
        --env.group_size 2 --env.train_size 8 --env.max_tokens 32 \\
        --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.reward_fns import final_integer, tagged_answer
from atroposlib.envs.reward_fns.answer_tag_reward import same_answer
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv
from atroposlib.utils.counting_pictures import (
    BARE_PROMPT,
    COLOURS,
    QuestionKind,
    draw,
    make_item,
)
from atroposlib.utils.image_messages import prompt_with_pictures, vision_processor
from atroposlib.utils.tokenize_for_trainer import IGNORE_INDEX, tokenize_for_trainer

__all__ = ["COLOURS", "MultimodalCountingEnv", "count_score", "draw", "make_item"]

IMAGE_PLACEHOLDER = "<image>"
SYSTEM_PROMPT = (
    "Look at the image. You may think inside <think></think>; then answer <answer>N</answer>."
)


def count_score(completion: str, count: int, answer_format: str = "tagged") -> float:
    if answer_format == "bare":
        return float(final_integer(completion) == count)
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
    question_kind: QuestionKind = Field(
        "colour_shape",
        description="'colour_shape': how many of one colour and shape; 'total': how many "
        "shapes (atroposlib/utils/counting_pictures.py says why both).",
    )
    answer_format: Literal["tagged", "bare"] = Field(
        "tagged", description="'tagged': <answer>N</answer>; 'bare': the reply's last integer."
    )


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
        kind = self.config.question_kind
        self.train_items = [make_item(first + i, kind) for i in range(self.config.train_size)]
        self.eval_items = [make_item(-1 - i, kind) for i in range(self.config.eval_size)]
        # a vision-language model's processor expands the picture into its image tokens
        self.processor = vision_processor(self.config.tokenizer_name)

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        system = BARE_PROMPT if self.config.answer_format == "bare" else SYSTEM_PROMPT
        image = {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{item['image']}"},
        }
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": item["question"]}, image]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        return count_score(completion, item["count"], self.config.answer_format)

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"seed": item["seed"], "question": item["question"], "gold": item["count"]}

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list]:
        messages = self.messages_for(item)
        sampled_ids = self.processor is not None  # the engine's own tokens and logprobs
        extra = (
            {"logprobs": True, "extra_body": {"return_tokens_as_token_ids": True}}
            if sampled_ids
            else {}
        )
        chat = await self.server.chat_completion(
            messages=messages,
            n=self.config.group_size,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            **extra,
        )
        group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "messages": []}
        prompt_ids = prompt_with_pictures(self.processor, messages, True)[0] if sampled_ids else []
        for choice in chat.choices:
            reply = choice.message.content or ""
            conversation = [*text_only(messages), {"role": "assistant", "content": reply}]
            if sampled_ids:
                tokenized = sampled_rollout(prompt_ids, choice)
                group.setdefault("inference_logprobs", []).append(tokenized["logprobs"])
            else:
                finish = choice.finish_reason or ""
                tokenized = tokenize_for_trainer(self.tokenizer, conversation, finish_reason=finish)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(self.score(reply, item))
            group["messages"].append(conversation)
        group["images"] = [item["image"]] * len(chat.choices)
        return group, []


def sampled_rollout(prompt_ids: list[int], choice: Any) -> dict[str, list]:
    """A choice as the trainer takes it: the processor's prompt ids (the engine's, image
    tokens expanded), then the ids the engine sampled (`return_tokens_as_token_ids`), with
    their logprobs, so the trainer's ratio and clipping see the sampling policy."""
    entries = choice.logprobs.content if choice.logprobs else None
    if not entries:
        raise ValueError("the engine answered without per-token logprobs")
    sampled = [int(entry.token.removeprefix("token_id:")) for entry in entries]
    return {
        "tokens": prompt_ids + sampled,
        "masks": [IGNORE_INDEX] * len(prompt_ids) + sampled,
        "logprobs": [1.0] * len(prompt_ids) + [entry.logprob for entry in entries],
    }


if __name__ == "__main__":
    MultimodalCountingEnv.cli()
