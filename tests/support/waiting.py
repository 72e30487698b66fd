"""Waiting for observable state against a deadline, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from atroposlib.utils.waiting import WaitTimeout, poll_until

T = TypeVar("T")

POLL_S = 0.05


def wait_until(
    predicate: Callable[[], T], timeout_s: float, message: str, poll_s: float = POLL_S
) -> T:
    """Poll `predicate` until it returns something truthy (returned), or fail after timeout_s.

    The predicate is checked once more at the deadline, so a slow machine that gets
    there late still passes; the AssertionError carries `message` otherwise.
    """
    try:
        return poll_until(predicate, timeout_s, message, interval_s=poll_s)
    except WaitTimeout:
        raise AssertionError(f"{message} (waited {timeout_s}s)") from None


async def wait_until_async(
    predicate: Callable[[], T], timeout_s: float, message: str, poll_s: float = POLL_S
) -> T:
    """`wait_until` inside an event loop: sleeps with asyncio so other tasks run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        _fail_if_past(deadline, timeout_s, message)
        await asyncio.sleep(poll_s)


def _fail_if_past(deadline: float, timeout_s: float, message: str) -> None:
    if time.monotonic() >= deadline:
        raise AssertionError(f"{message} (waited {timeout_s}s)")
