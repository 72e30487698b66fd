"""Which request errors are worth another try, and how split requests are put back together.

Kept apart from the client classes so the manager, every client and the tests share one
rule: a server that cannot be reached at all is failed over at once (the manager knows
other servers), a 5xx / 429 / timeout is retried where it happened, any other 4xx is the
caller's mistake and raised.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}
NO_SUCH_ROUTE = {404, 405, 501}


def merge_choices(answers: Any) -> Any:
    """One OpenAI answer from several (a list); choices re-indexed in order, usage summed."""
    if not isinstance(answers, list):
        return answers
    merged = answers[0]
    merged.choices = [choice for answer in answers for choice in answer.choices]
    for index, choice in enumerate(merged.choices):
        choice.index = index
    if getattr(merged, "usage", None) is not None:
        for answer in answers[1:]:
            if answer.usage is not None:
                merged.usage.completion_tokens += answer.usage.completion_tokens
                merged.usage.total_tokens += answer.usage.completion_tokens
    return merged


def offset_seed(kwargs: dict[str, Any], offset: int) -> dict[str, Any]:
    """`{"seed": seed + offset}` for the part of a split request that starts at sample
    `offset`, or `{}` when the request has no seed; parts of one seeded request then
    draw different samples, and the same request draws the same ones again."""
    seed = kwargs.get("seed")
    return {} if seed is None else {"seed": int(seed) + offset}


def is_unreachable(exc: BaseException) -> bool:
    """The server could not be reached at all (refused, reset, DNS): not worth retrying there."""
    if type(exc).__name__ == "APITimeoutError":
        return False
    return isinstance(exc, (httpx.ConnectError, ConnectionError)) or (
        type(exc).__name__ == "APIConnectionError"
    )


def is_retryable(exc: BaseException) -> bool:
    """Connection problems, timeouts and 5xx/429 are worth another try; 4xx are not."""
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        if response is not None:
            status = getattr(response, "status_code", None)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(
        exc, (httpx.TransportError, asyncio.TimeoutError, ConnectionError, OSError)
    ) or (type(exc).__name__ in ("APIConnectionError", "APITimeoutError"))
