"""The envelopes of OpenAI chat and text completion answers, built in one place.

Used by the CPU inference server (over HTTP) and by the clients that build
answers locally (`ManagedServer`, the testing harness), so all of them produce
what the `openai` SDK parses.
"""

from __future__ import annotations

import time
import uuid
from typing import Any


def chat_choice(index: int, text: str, finish_reason: str, logprobs: Any = None) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def text_choice(index: int, text: str, finish_reason: str, logprobs: Any = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_body(
    kind: str, model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None
) -> dict[str, Any]:
    """`kind` is "chat" (chat.completion) or "text" (text_completion)."""
    chat = kind == "chat"
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body
