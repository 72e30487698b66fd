"""Groups built from known text with a real tokenizer, so a viewer's decoded output is known."""

from __future__ import annotations

import base64
import io
from typing import Any

MASKED = -100


def text_group(
    tokenizer: Any,
    prompt: str,
    completions: list[str],
    scores: list[float],
    **extra: Any,
) -> dict[str, Any]:
    """A group whose sequences are prompt + completion, the prompt masked as envs do."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    tokens, masks = [], []
    for completion in completions:
        completion_ids = tokenizer.encode(completion, add_special_tokens=False)
        tokens.append(prompt_ids + completion_ids)
        masks.append([MASKED] * len(prompt_ids) + completion_ids)
    return {"tokens": tokens, "masks": masks, "scores": scores, **extra}


def png_base64(color: tuple[int, int, int] = (200, 30, 30), size: int = 8) -> str:
    """A small solid-colour PNG, base64-encoded (no data: prefix)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
