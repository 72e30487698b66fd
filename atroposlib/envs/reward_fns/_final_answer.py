"""Reading a completion's final answer: after the reasoning, inside one answer tag.

The rules the answer-tag rewards share: only the text after the last `</think>` is the
answer (an unclosed `<think>` means there is none, so nothing written while reasoning
counts); the answer must sit in exactly one `<tag>...</tag>` there (two different
answers are a hedge, not an answer); and an answer longer than `max_chars` is
rejected rather than searched, so padding a reply with guesses cannot pay.
"""

from __future__ import annotations

import re

INTEGER = re.compile(r"-?\d+")


def after_thinking(text: str) -> str | None:
    """The reply after the last `</think>`; None while a `<think>` is left open."""
    lowered = text.lower()
    if "</think>" in lowered:
        return text[lowered.rindex("</think>") + len("</think>") :]
    return None if "<think>" in lowered else text


def tagged_answer(text: str, tag: str = "answer", max_chars: int = 200) -> str | None:
    """The stripped content of the one `<tag>` block after thinking, else None."""
    reply = after_thinking(text or "")
    if reply is None:
        return None
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", reply, re.DOTALL | re.IGNORECASE)
    if len(found) != 1 or len(found[0]) > max_chars:
        return None
    return found[0].strip()


def final_integer(text: str, max_chars: int = 200) -> int | None:
    """The last integer of a short bare reply (after thinking), for models without tags."""
    reply = after_thinking(text or "")
    if reply is None or len(reply.strip()) > max_chars:
        return None
    numbers = INTEGER.findall(reply)
    return int(numbers[-1]) if numbers else None
