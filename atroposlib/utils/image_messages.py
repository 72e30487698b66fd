"""Pictures in chat messages: one reading for the engine, the environment and the trainer.

Design decisions:
- A picture travels as OpenAI sends it: an `image_url` part whose url is a
  `data:image/...;base64,...` URL (vLLM's form; a plain `image` part with base64 data is
  read too). Nothing here fetches a remote URL: runs are offline, and an engine that
  fetched what a request names would be a way into the network.
- The model's own processor does the rest: its chat template renders each picture as
  its placeholder (Idefics3's `<image>`, Qwen2-VL's vision pad), and the processor
  expands that into the picture's image tokens. The engine prompts with those ids
  (`prompt_with_pictures`), an environment trains on them and a trainer checks them
  against the same processor and feeds it the same pixels (`pixel_inputs`;
  docs/trainer.md, Vision-language models), so nobody hand-makes an expansion.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from atroposlib.utils.tokenize_for_trainer import IGNORE_INDEX, strip_cut_off_eos

IMAGE_PART_TYPES = ("image_url", "image")


def is_vision_language(source: str) -> bool:
    """Whether the checkpoint (or hub name) at `source` is a vision-language model: its
    config has a vision part, so its processor, not its tokenizer alone, reads chats."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(source), "vision_config", None) is not None


def vision_processor(source: str) -> Any:
    """The processor of the vision-language model at `source`, or None for a text model."""
    if not is_vision_language(source):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(source)


PICTURE_TOKEN_ATTRIBUTES = ("image_token", "fake_image_token", "global_image_tag", "video_token")
"""A processor's placeholder strings for pictures (Idefics3, Qwen2-VL, LLaVA name them so)."""


def picture_token_ids(processor: Any) -> list[int]:
    """The ids that stand for pictures in a prompt: a reply must never hold one (the
    trainer would feed pixels to it, and refuses the group instead)."""
    tokenizer = processor.tokenizer
    ids = set()
    for attribute in PICTURE_TOKEN_ATTRIBUTES:
        token = getattr(processor, attribute, None)
        if isinstance(token, str) and token:
            found = tokenizer.convert_tokens_to_ids(token)
            if isinstance(found, int) and found != tokenizer.unk_token_id:
                ids.add(found)
    return sorted(ids)


def decode_picture(data: str) -> Any:
    """A base64 picture (plain or a `data:` URL) as an RGB PIL image; ValueError if not one."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, str):  # a group's `images` is typed Any on the wire
        raise ValueError(f"an image must be a base64 string, not {type(data).__name__}")
    if data.startswith(("http://", "https://")):
        raise ValueError("an image must be a data: URL (base64): nothing is fetched")
    payload = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        raw = base64.b64decode(payload, validate=True)
        return Image.open(io.BytesIO(raw)).convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"an image is not a base64 picture ({exc})") from exc


def part_data(part: dict[str, Any]) -> str:
    """An image part's data: `image_url.url` (or a bare string there), or `image`."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
    else:
        url = part.get("image")
    if not isinstance(url, str) or not url:
        raise ValueError(f"an {part.get('type')} part holds no image data")
    return url


def split_pictures(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages with each image part as `{"type": "image"}` (what transformers' chat
    templates render as the model's placeholder), and the pictures' data in order."""
    converted, pictures = [], []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                    pictures.append(part_data(part))
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            content = parts
        converted.append({**message, "content": content})
    return converted, pictures


def prompt_with_pictures(
    processor: Any, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> tuple[list[int], list[Any]]:
    """(token ids, decoded pictures) of a chat for a vision-language model: the processor's
    template and expansion (see the module docstring)."""
    converted, data = split_pictures(messages)
    pictures = [decode_picture(item) for item in data]
    text = processor.apply_chat_template(
        converted, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    made = processor(text=[text], images=[pictures] if pictures else None)
    return list(made["input_ids"][0]), pictures


def pixel_inputs(processor: Any, rows: list[list[Any]], dtype: Any) -> dict[str, Any]:
    """The processor's picture inputs for a batch's rows of decoded pictures (a row with
    none is padded by the processor), floats in `dtype`."""
    made = processor.image_processor(images=rows, return_tensors="pt")
    return {
        name: value.to(dtype) if value.is_floating_point() else value
        for name, value in made.items()
    }


def tokenize_with_pictures(
    processor: Any,
    prompt: list[dict[str, Any]],
    reply: str,
    finish_reason: str = "",
) -> dict[str, list[int]]:
    """`tokenize_for_trainer`'s answer for a prompt with pictures and one assistant reply:
    the prompt masked, the reply (and its end token, unless cut by the limit) trained."""
    prompt_ids, _ = prompt_with_pictures(processor, prompt, add_generation_prompt=True)
    whole = [*prompt, {"role": "assistant", "content": reply}]
    tokens, _ = prompt_with_pictures(processor, whole, add_generation_prompt=False)
    if tokens[: len(prompt_ids)] != prompt_ids:
        raise ValueError("the chat template renders the prompt differently once replied to")
    masks = [IGNORE_INDEX] * len(prompt_ids) + tokens[len(prompt_ids) :]
    if finish_reason == "length":
        strip_cut_off_eos(processor.tokenizer, tokens, masks)
    return {"tokens": tokens, "masks": masks}
