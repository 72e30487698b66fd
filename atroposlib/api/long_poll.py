"""`GET /batch` that waits for data: RFC 7240's `Prefer: wait=N`.

A trainer that finds no batch used to poll again after a back-off, so a batch
completed just after a poll sat unread for up to that back-off (half a second
per step in the CPU quickstart, where a step trains in 0.1 s). With
`Prefer: wait=N` the API holds the request until a post is accepted or N
seconds pass (capped at `MAX_WAIT_S`), and answers as soon as a batch can be
made; the answer says `Preference-Applied: wait=N`, so a trainer can tell an API
that waits from one (upstream's) that ignores the header and answers at once.
Without the header nothing changes.

`GET /status-env?after_step=S` with the same header is the environments' long poll:
an env whose off-policy window is full has nothing to do until the trainer takes a
batch, so instead of polling every half second (and leaving the trainer to drain
the queue meanwhile) it asks to be answered once the API's step passes S.
"""

from __future__ import annotations

import asyncio
import re

MAX_WAIT_S = 30.0
NO_BATCH = {"batch": None}  # RunState.next_batch's answer while no batch can be made
_WAIT = re.compile(r"(?:^|[;,\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def requested_wait(prefer: str | None) -> float:
    """Seconds asked for in a `Prefer` header (0 when absent or malformed), capped."""
    if not prefer:
        return 0.0
    found = _WAIT.search(prefer)
    return min(float(found.group(1)), MAX_WAIT_S) if found else 0.0


class Arrivals:
    """Wakes every waiting `/batch` when a post is accepted."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Return at the next post, or after `timeout_s`."""
        try:
            await asyncio.wait_for(self._event.wait(), max(0.0, timeout_s))
        except TimeoutError:  # not the builtin TimeoutError before Python 3.11
            pass
