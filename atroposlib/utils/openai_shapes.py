"""The envelopes of OpenAI chat and text completion answers, built in one place.

Used by the CPU inference server (over HTTP) and by the clients that build
answers locally (`ManagedServer`, the testing harness), so all of them produce
what the `openai` SDK parses.

Design decision: these are pure functions of plain values (token ids, floats,
a `text_of` callable for token spelling); none needs a model or a tokenizer
object, so each shape is unit-tested alone with hand-written inputs
(tests/inference/test_openai_requests.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any


def chat_choice(
    index: int, text: str | None, finish_reason: str, logprobs: Any = None
) -> dict[str, Any]:
    """`text` None: a message that holds only tool calls (OpenAI's `content: null`)."""
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
    body: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Trainers and the SDK read `total_tokens`; keep the sum in one place."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def token_text(token_id: int, as_ids: bool, decode: Callable[[list[int]], str]) -> str:
    """vLLM's `return_tokens_as_token_ids` lets a client recover ids that text cannot carry."""
    return f"token_id:{token_id}" if as_ids else decode([token_id])


def chat_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[int, float]]],
    text_of: Callable[[int], str],
) -> dict[str, Any]:
    """Chat answers carry logprobs per token as objects with UTF-8 bytes, unlike text answers."""
    content = []
    for position, (token, value) in enumerate(zip(token_ids, logprobs, strict=True)):
        text = text_of(token)
        alternatives = top_logprobs[position] if top_logprobs else []
        content.append(
            {
                "token": text,
                "logprob": value,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {
                        "token": text_of(alt),
                        "logprob": alt_value,
                        "bytes": list(text_of(alt).encode()),
                    }
                    for alt, alt_value in alternatives
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[int, float]]],
    text_of: Callable[[int], str],
    include_top: bool,
) -> dict[str, Any]:
    """Text answers use the legacy parallel lists, with character offsets into the text."""
    texts = [text_of(t) for t in token_ids]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": [
            {text_of(alt): value for alt, value in alternatives} for alternatives in top_logprobs
        ]
        if include_top
        else None,
        "text_offset": offsets,
    }
