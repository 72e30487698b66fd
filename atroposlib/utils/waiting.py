"""The one way processes here wait for something: poll a check against a deadline.

Health waits (the engine's, the launcher's) and port waits all go through
`poll_until`, so a wait is never a fixed sleep and always ends in a clear error.
A check may raise to stop the wait early (a process that died while starting).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from atroposlib.utils.http_client import shared_http_client

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The check never came true before the deadline."""


def poll_until(
    check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.2
) -> T:
    """The first truthy result of `check()`, polled every `interval_s` until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (result := _poll_once(check, deadline, timeout_s, what)) is None:
        time.sleep(interval_s)
    return result


async def poll_until_async(
    check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """`poll_until` for a coroutine: the event loop runs on between polls."""
    deadline = time.monotonic() + timeout_s
    while (result := _poll_once(check, deadline, timeout_s, what)) is None:
        await asyncio.sleep(interval_s)
    return result


def _poll_once(
    check: Callable[[], T | None], deadline: float, timeout_s: float, what: str
) -> T | None:
    """`check()`'s result when truthy, else None; WaitTimeout once past `deadline`."""
    result = check()
    if result:
        return result
    if time.monotonic() >= deadline:
        raise WaitTimeout(f"{what} after {timeout_s:.0f}s")
    return None


def answers_200(url: str, timeout_s: float = 2.0) -> bool:
    """Whether GET `url` answers 200 (any transport error is a no)."""
    try:
        return shared_http_client().get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
